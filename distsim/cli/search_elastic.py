"""``distsim search elastic``: EasyScale's intra-job planner, ESTs on heterogeneous GPUs (Li et al., ALGORITHMS.md
5.2)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import click

from distsim.cli.common import RegistryHelpOption, parse_type_map
from distsim.cli.options import CommandArgs, ModelOptions, Options, OutputOptions
from distsim.cli.search import search
from distsim.core.cluster import GPUS
from distsim.core.errors import DistsimError


@search.command()
@click.option("--model", "-m", "model_name", required=True, metavar="NAME|FILE",
              help="Zoo model (see `distsim models`) or a YAML/JSON model file.")  # fmt: skip
@click.option("--max-workers", "-P", "max_workers", type=int, required=True, metavar="P",
              help="maxP: the job's ESTs (logical data-parallel workers), fixed whatever the GPUs.")  # fmt: skip
@click.option("--gpus", "gpus_text", required=True, metavar="TYPE:N,...", cls=RegistryHelpOption, registry=GPUS,
              help="Available GPUs per type, e.g. V100:4,T4:8 (types: {names}).")  # fmt: skip
@click.option("--micro-batch-size", "-b", type=click.IntRange(min=1), default=32, show_default=True,
              help="Samples per EST mini-batch: the batch of the simulated single-GPU iteration.")  # fmt: skip
@click.option("--capabilities", "capabilities_text", metavar="TYPE:RATE,...",
              help="Capabilities C_i in mini-batches/s (e.g. measured ones), replacing the simulated ones for the "
                   "types named.")  # fmt: skip
@click.option("--waste-cut", type=float, default=0.30, show_default=True,
              help="Drop plans whose normalised waste (waste / the GPUs' summed capability) exceeds this.")  # fmt: skip
@click.option("--top", type=click.IntRange(min=0), default=10, show_default=True,
              help="Plans to print (0: all).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of the table.")
def elastic(**kw: Any) -> None:
    """EasyScale's intra-job planner: how many GPUs of each type host the job's maxP ESTs, and how many ESTs each.

    A GPU of type i runs C_i mini-batches/s of this job (its capability: by default 1 / the simulated iteration of
    the model alone on one such GPU at --micro-batch-size; --capabilities gives measured ones). With N_i GPUs of
    type i hosting A_i ESTs each, a global step takes f = max A_i / C_i, the job trains maxP / f mini-batches/s,
    and the waste (Eq. 1c, each GPU counted: N_i (C_i - A_i/f), plus idle EST slots) is what the GPUs could do
    beyond that. Every minimal set of available GPUs is planned at its fastest mapping; plans wasting more than
    --waste-cut of their capability are dropped, the rest ranked by throughput, then fewer GPUs.

    \b
    16 ESTs of ResNet-50 on 4 V100 and 8 T4:
      distsim search elastic --model resnet50 --max-workers 16 --gpus V100:4,T4:8
    With measured capabilities:
      distsim search elastic --model resnet50 --max-workers 8 --gpus V100:2,P100:4 --capabilities V100:10.5,P100:4.1
    """
    from distsim.elastic.capability import Capability, measure
    from distsim.elastic.planner import cut_plans, enumerate_plans
    from distsim.io.files import load_model

    args = ElasticSearchArgs.from_params(**kw)
    job = args.planner
    if job.max_workers < 1:
        raise DistsimError(f"--max-workers (maxP) must be >= 1, got {job.max_workers}")
    if not 0 <= job.waste_cut <= 1:
        raise DistsimError(f"--waste-cut is a fraction in [0, 1], got {job.waste_cut}")
    available = parse_type_map(job.gpus_text, "--gpus", int)
    given = parse_type_map(job.capabilities_text, "--capabilities", float) if job.capabilities_text else {}
    extra = sorted(set(given) - set(available))
    if extra:
        raise DistsimError(f"--capabilities names {', '.join(extra)}, which --gpus does not offer")
    model = load_model(args.model.model_name)
    caps: dict[str, Capability] = {}
    for t in available:
        caps[t] = measure(model, t, job.micro_batch_size)
        if t in given:  # the simulated peak memory stays: an EST must fit whatever its speed
            caps[t] = replace(caps[t], per_s=given[t], iteration_s=None, source="given (--capabilities)")
    rates = {t: c.per_s for t, c in caps.items()}
    hosting = {t: n for t, n in available.items() if caps[t].fits}  # a GPU that cannot hold one EST hosts none
    if any(available.values()) and not any(hosting.values()):
        short = "; ".join(f"{t}: needs {caps[t].peak_memory_bytes / 1e9:,.1f} GB of "
                          f"{caps[t].memory_bytes / 1e9:,.0f} GB" for t, n in available.items() if n)  # fmt: skip
        raise DistsimError(f"no elastic plan for {job.max_workers} ESTs on {job.gpus_text}: no GPU holds one EST "
                           f"of {model.name} at --micro-batch-size {job.micro_batch_size} ({short})")  # fmt: skip
    everything = enumerate_plans(job.max_workers, rates, hosting)
    plans = cut_plans(everything, job.waste_cut)
    shown = plans if job.top == 0 else plans[: job.top]
    if args.outputs.as_json:
        click.echo(json.dumps({
            "model": model.name, "max_workers": job.max_workers, "micro_batch_size": job.micro_batch_size,
            "available": available, "capabilities": {t: c.to_dict() for t, c in caps.items()},
            "waste_cut": job.waste_cut, "unfit": [t for t in available if not caps[t].fits],
            "planned": len(everything), "cut": len(everything) - len(plans),
            "plans": [p.to_dict() for p in shown],
        }, indent=2))  # fmt: skip
        return
    if not plans:
        why = "none left after the waste cut" if everything else "no GPUs available"
        raise DistsimError(f"no elastic plan for {job.max_workers} ESTs on {job.gpus_text}: {why} "
                           f"({len(everything)} planned; --waste-cut {job.waste_cut})")  # fmt: skip
    click.echo(_report(model.name, job, available, caps, everything, plans, shown))


@dataclass(frozen=True)
class ElasticPlanOptions(Options):
    """The job (--max-workers ESTs of --micro-batch-size), the GPUs offered and their capabilities, the waste cut and
    the plans shown (--top)."""

    max_workers: int = 1
    gpus_text: str = ""
    micro_batch_size: int = 32
    capabilities_text: str | None = None
    waste_cut: float = 0.30
    top: int = 10


@dataclass(frozen=True)
class ElasticSearchArgs(CommandArgs):
    """The option groups of ``distsim search elastic``."""

    model: ModelOptions
    planner: ElasticPlanOptions
    outputs: OutputOptions


def _report(model: str, job: ElasticPlanOptions, available: dict[str, int], caps: dict[str, Any],
            everything: list[Any], plans: list[Any], shown: list[Any]) -> str:  # fmt: skip
    import pandas as pd

    p = job.max_workers
    lines = [f"{model}, maxP = {p} ESTs of {job.micro_batch_size} samples, on "
             f"{', '.join(f'{n} {t}' for t, n in available.items())}; capabilities C_i:"]  # fmt: skip
    for t, c in caps.items():
        memory = "" if c.fits else (f"; one EST needs {c.peak_memory_bytes / 1e9:.1f} GB, over the GPU's "
                                    f"{c.memory_bytes / 1e9:.0f} GB: not planned")  # fmt: skip
        lines.append(f"  {t:<6} {c.per_s:10.3f} mini-batches/s  ({c.source}{memory})")
    cut = len(everything) - len(plans)
    lines += [
        f"{len(everything)} plans (minimal GPU sets at their fastest mapping); {cut} cut for normalised waste over "
        f"{job.waste_cut:.2f}; {len(plans)} ranked by throughput, then fewer GPUs"
        + (f" (the best {len(shown)} shown):" if len(shown) < len(plans) else ":"),
        "",
    ]
    types = list(available)
    rows = []
    for rank, plan in enumerate(shown, 1):
        row: dict[str, Any] = {"#": rank}
        for t in types:
            row[t] = f"{plan.counts[t]}x{plan.ests[t]}" if t in plan.counts else "-"
        row |= {
            "GPUs": plan.gpus,
            "ESTs": f"{plan.est_slots}" + (f" ({plan.est_slots - p} idle)" if plan.est_slots > p else ""),
            "step_ms": f"{plan.step_s * 1e3:.2f}",
            "minibatch/s": f"{plan.throughput:.3f}",
            "waste/s": f"{plan.waste:.3f}",
            "norm_waste": f"{plan.normalized_waste:.3f}",
        }
        rows.append(row)
    with pd.option_context("display.width", 250):
        lines.append(pd.DataFrame(rows).to_string(index=False))
    lines += ["", "TYPE NxA: N GPUs of that type, A ESTs on each; step = max A / C_i; throughput = maxP / step; "
              "waste = sum N (C_i - A/step) + idle ESTs / step (Eq. 1c per GPU)"]  # fmt: skip
    return "\n".join(lines)
