"""``distsim search dapple``: DAPPLE's planner of uneven, replicated pipeline stages (Fan et al. 2021, Sec. IV)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import click

from distsim.cli.common import GB, TRACE_FORMATS, Progress, check_outputs, load_costs_for, write_trace
from distsim.cli.options import CommandArgs, CostOptions, Options, OutputOptions
from distsim.cli.search import SearchOptions, model_and_gpus, opt_int_list, search, shared_options
from distsim.core.errors import DistsimError


def _policies(text: str) -> tuple[str, ...]:
    from distsim.search.dapple import POLICIES

    names = tuple(x.strip().lower() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in POLICIES]
    if not names or bad:
        raise DistsimError(f"--policies takes a comma-separated subset of {','.join(POLICIES)}; got {text!r}")
    return tuple(dict.fromkeys(names))


@search.command()
@shared_options
@click.option("--micro-batches", "micro_batches_text", metavar="LIST",
              help="Micro-batch counts M to try (dividing the global batch). [default: every divisor]")  # fmt: skip
@click.option("--schedule", type=click.Choice(["1f1b", "gpipe"]), default="1f1b", show_default=True,
              help="Early backward (1f1b) or GPipe: the in-flight activations the memory check counts.")  # fmt: skip
@click.option("--warmup-policy", type=click.Choice(["A", "B", "best"]), default="best", show_default=True,
              help="Warm-up K_i = min(S-i, D) (A) or min(2(S-i)-1, D) (B); best simulates both.")  # fmt: skip
@click.option("--max-in-flight", "max_in_flight", type=click.IntRange(min=1), metavar="D",
              help="At most D micro-batches in flight on a stage (DAPPLE's D). [default: no limit]")  # fmt: skip
@click.option("--policies", "policies_text", default="fresh,append,scatter", show_default=True, metavar="LIST",
              help="Placement policies the planner composes: Fresh First, Append First, Scatter First.")  # fmt: skip
@click.option("--ignore-memory", is_flag=True, help="Plan without the GPU memory check.")
@click.option("--beam", type=click.IntRange(min=0), default=None, metavar="K",
              help="Expand the best K planned prefixes per split position (0: all, the paper's DP). [default: all "
                   "up to 1,024 possible sets of used GPUs (two 8-GPU machines), else 128]")  # fmt: skip
@click.option("--choose", type=click.Choice(["simulator", "estimate"]), default="simulator", show_default=True,
              help="Pick among the shortlist (best plan per M, pure DP, straight) by simulated time, or take the "
                   "planner's lowest estimate as DAPPLE does.")  # fmt: skip
@click.option("--plan-out", default="dapple.plan.yaml", show_default=True, metavar="FILE",
              help="Write the chosen plan as a plan file ('' to skip).")  # fmt: skip
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), metavar="FILE",
              help=f"Chrome/Perfetto trace of the chosen plan's simulated iteration ({TRACE_FORMATS}).")  # fmt: skip
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Gantt chart of the chosen plan's simulated iteration (PNG/SVG/PDF).")  # fmt: skip
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes planning micro-batch counts in parallel. [default: the CPU count]")  # fmt: skip
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
def dapple(**kw: Any) -> None:
    """DAPPLE's planner: uneven stages, stage replication and device placement (Fan et al. 2021, Sec. IV).

    A dynamic programme over split positions and replica counts, placing each new stage with the Fresh First,
    Append First and Scatter First policies on the cluster's machines, scores every plan with DAPPLE's latency
    model (pivot stage, corrected ending term) for every micro-batch count M. Pure data parallelism and the
    straight pipeline are candidates too. The shortlist (the best plan per M, the best pure-DP and straight
    plans) is then simulated under warm-up policies A and B; the chosen plan is written as a plan file.

    \b
    BERT-48 on two 8-GPU V100 machines (DAPPLE's config A), global batch 64:
      distsim search dapple --model bert-exlarge --cluster dapple-a --global-batch 64
    The same on 16 single-GPU machines (config B), only Fresh First placement:
      distsim search dapple --model bert-exlarge --cluster dapple-b --global-batch 64 --policies fresh
    """
    from distsim.plans.simulate import DEFAULT_MAX_TASKS
    from distsim.search.dapple import check_with_simulator, plan_dapple, shortlist

    args = DappleArgs.from_params(**kw)
    outputs, planner = args.outputs, args.planner
    stdout_taken = check_outputs(outputs, {"plan_out": "--plan-out", "trace_path": "--trace"}, {"plot_path": "--plot"})
    model, cluster, gpus = model_and_gpus(args.search, args.costs)
    spec = planner.spec(gpus, args.search.global_batch)
    costs = load_costs_for(args.costs, cluster)
    quiet = outputs.quiet
    progress = Progress(0, "micro-batch counts planned", enabled=not quiet)
    workers = planner.workers or os.cpu_count() or 1
    result = plan_dapple(model, cluster, spec, costs, progress=lambda d, t, _m: progress(d, t), workers=workers)
    policies = ("A", "B") if planner.warmup_policy == "best" else (spec.warmup_policy,)
    checking = Progress(0, "shortlisted plans simulated", enabled=not quiet)
    checked = check_with_simulator(result, costs, policies, progress=lambda d, t, _m: checking(d, t))
    chosen = None
    if checked:
        if planner.choose == "simulator":
            chosen = min(checked, key=lambda c: (c.iteration_s, c.candidate.latency_s))
        else:
            chosen = min(checked, key=lambda c: (c.candidate.latency_s, c.iteration_s))
    written = [] if chosen is None else _write_chosen(result, chosen, model, costs, args)
    if outputs.as_json:
        data = result.to_dict()
        data["shortlist"] = [
            {"label": c.label, "notation": c.candidate.notation, "micro_batches": c.candidate.micro_batches,
             "estimate_s": c.candidate.latency_s, "simulated_s": c.simulated_s}
            for c in checked
        ]  # fmt: skip
        data["chosen"] = None if chosen is None else {"label": chosen.label, "warmup_policy": chosen.policy,
                                                      "notation": chosen.candidate.notation,
                                                      "estimate_s": chosen.candidate.latency_s,
                                                      "simulated_s": chosen.iteration_s}  # fmt: skip
        data["choose"] = planner.choose
        data["written"] = written
        click.echo(json.dumps(data, indent=2))
        return
    lines = [_dapple_report(result, checked, chosen, planner.choose), *(f"wrote {path}" for path in written)]
    left_out = len(shortlist(result)) - len(checked)
    if left_out:
        lines.append(f"note: {left_out} shortlisted plan(s) left out: too many micro-batches to simulate (over "
                     f"{DEFAULT_MAX_TASKS:,} tasks); --micro-batches picks the counts to plan")  # fmt: skip
    if outputs.plan_out and chosen is not None and outputs.plan_out != "-":
        lines.append(f"simulate it: distsim simulate --plan {outputs.plan_out} --plot dapple.png")
    click.echo("\n".join(lines), err=bool(stdout_taken))


@dataclass(frozen=True)
class PlannerOptions(Options):
    """What DAPPLE's planner tries (micro-batch counts, placement policies, beam), for which schedule and warm-up,
    and how the plan is chosen from the shortlist."""

    micro_batches_text: str | None = None
    schedule: str = "1f1b"
    warmup_policy: str = "best"
    max_in_flight: int | None = None
    policies_text: str = "fresh,append,scatter"
    ignore_memory: bool = False
    beam: int | None = None
    choose: str = "simulator"
    workers: int | None = None

    def spec(self, gpus: int, global_batch: int) -> Any:
        """The planner's :class:`~distsim.search.dapple.DappleSpec` (each list option checked)."""
        from distsim.search.dapple import DappleSpec

        return DappleSpec(
            gpus=gpus,
            global_batch=global_batch,
            micro_batches=opt_int_list(self.micro_batches_text, "--micro-batches"),
            schedule=self.schedule,
            warmup_policy="A" if self.warmup_policy == "best" else self.warmup_policy,
            max_in_flight=self.max_in_flight,
            policies=_policies(self.policies_text),
            memory_filter=not self.ignore_memory,
            beam=self.beam,
        )


@dataclass(frozen=True)
class DappleArgs(CommandArgs):
    """The option groups of ``distsim search dapple``."""

    search: SearchOptions
    costs: CostOptions
    outputs: OutputOptions
    planner: PlannerOptions


def _write_chosen(result: Any, chosen: Any, model: Any, costs: Any, args: DappleArgs) -> list[str]:
    """Write the chosen plan's file (--plan-out), and its simulated iteration's trace and Gantt chart."""
    from distsim.io.files import write_figure, write_plan
    from distsim.plans.simulate import simulate

    outputs, written = args.outputs, []
    best = chosen.candidate
    plan = result.plan(
        best, model=args.search.model_name, cluster=args.search.cluster_name, warmup_policy=chosen.policy,
        driver="distsim search dapple", planner_estimate_s=round(best.latency_s, 9),
        predicted_iteration_s=round(chosen.iteration_s, 9), global_batch=result.spec.global_batch,
    )  # fmt: skip
    if outputs.plan_out:
        written.append(str(write_plan(outputs.plan_out, plan)))
    if outputs.trace_path or outputs.plot_path:
        r = simulate(model, result.cluster, result.plan(best, warmup_policy=chosen.policy), costs)
        title = f"{model.name} {best.notation} (M={best.micro_batches}) on {result.cluster.name}"
        if outputs.trace_path:
            write_trace(outputs.trace_path, r.timeline, title, quiet=outputs.quiet)
            written.append(outputs.trace_path)
        if outputs.plot_path:
            from distsim.io.plots import gantt

            ax = gantt(r.timeline, title=f"{title}: {r.iteration_time_s * 1e3:.1f} ms")
            write_figure(outputs.plot_path, ax.figure)
            written.append(outputs.plot_path)
    return written


def _dapple_report(result: Any, checked: list[Any], chosen: Any, choose: str) -> str:
    import pandas as pd

    from distsim.plans.plan import format_devices

    c, spec, model = result.cluster, result.spec, result.model
    lines = [
        f"{model.name} ({model.num_layers} layers) on {spec.gpus} GPUs of {c.name} ({c.describe()}), "
        f"global batch {spec.global_batch}; schedule {spec.schedule}; costs: {result.cost_source}",
        f"{result.evaluated:,} plans scored in {result.wall_time_s:.1f} s (placement: {', '.join(spec.policies)}); "
        f"the best per micro-batch count M, pure DP and straight simulated:",
    ]
    if result.pruned_states:
        lines.append(f"beam: the best {result.beam} planned prefixes expanded per split position, "
                     f"{result.pruned_states:,} left out (--beam 0 expands every one, slower)")  # fmt: skip
    lines.append("")
    if chosen is None:
        lines.append("no valid plan at any micro-batch count: none fits in memory or a stage has more replicas than "
                     "samples (--ignore-memory plans anyway, --micro-batches tries other counts)")  # fmt: skip
        return "\n".join(lines)
    rows = [
        {
            "": "*" if x is chosen else "",
            "candidate": x.label,
            "plan": x.candidate.notation,
            "M": x.candidate.micro_batches,
            "mbs": x.candidate.micro_batch_size,
            "estimate_ms": f"{x.candidate.latency_s * 1e3:.2f}",
            "simulated_ms": f"{x.iteration_s * 1e3:.2f}" + (f" ({x.policy})" if len(x.simulated_s) > 1 else ""),
            "samples_per_s": f"{x.candidate.micro_batches * x.candidate.micro_batch_size / x.iteration_s:,.1f}",
            "peak_mem_GB": f"{x.candidate.peak_memory_bytes / GB:.1f}",
        }
        for x in checked
    ]
    with pd.option_context("display.width", 250, "display.max_colwidth", 60):
        lines.append(pd.DataFrame(rows).to_string(index=False))
    by_estimate = min(checked, key=lambda x: (x.candidate.latency_s, x.iteration_s))
    best = chosen.candidate
    how = "lowest simulated time" if choose == "simulator" else "lowest planner estimate, as DAPPLE picks"
    lines += [
        "",
        f"chosen ({how}): {best.notation}, {best.micro_batches} micro-batches of {best.micro_batch_size} samples, "
        f"warm-up policy {chosen.policy}",
    ]
    for i, st in enumerate(best.stages):
        a, e = st.layers
        f, b, ar = best.forward_s[2 * i], best.backward_s[2 * i], best.allreduce_s[2 * i]
        lines.append(
            f"  stage {i}: layers {a}-{e - 1} ({model.layers[a].name} .. {model.layers[e - 1].name}) on "
            f"GPU{'s' if st.replicas > 1 else ''} {format_devices(st.devices)}: F {f * 1e3:.2f} ms, "
            f"B {b * 1e3:.2f} ms, AR+opt {ar * 1e3:.2f} ms"
        )
    pivot = best.pivot
    where = f"compute stage {pivot // 2}" if pivot % 2 == 0 else f"transfer {pivot // 2}->{pivot // 2 + 1}"
    gap = (best.latency_s - chosen.iteration_s) / chosen.iteration_s
    lines.append(f"  planner estimate {best.latency_s * 1e3:.2f} ms (pivot: {where}); simulator "
                 f"{chosen.iteration_s * 1e3:.2f} ms ({gap:+.1%} estimate vs simulation)")  # fmt: skip
    if len(chosen.simulated_s) == 2:
        sa, sb = chosen.simulated_s["A"], chosen.simulated_s["B"]
        lines.append(
            f"  warm-up policy A {sa * 1e3:.2f} ms, B {sb * 1e3:.2f} ms: P_B over P_A throughput {sa / sb:.2f}"
        )
    if by_estimate is not chosen:
        x = by_estimate.candidate
        lines.append(f"  the planner's own pick, {x.notation} at M={x.micro_batches} (estimate "
                     f"{x.latency_s * 1e3:.2f} ms), simulates to {by_estimate.iteration_s * 1e3:.2f} ms")  # fmt: skip
    for kind, label in (("DP", "pure data parallel"), ("straight", "straight pipeline")):
        same = [x for x in checked if x.candidate.kind == kind]
        if not same:
            lines.append(f"  vs {label}: no valid plan (out of memory or too few samples per replica)")
            continue
        other = min(same, key=lambda x: x.iteration_s)
        if other is not chosen:
            lines.append(f"  vs {label} (M={other.candidate.micro_batches}): simulated {other.iteration_s * 1e3:.2f} "
                         f"ms, so the chosen plan is {other.iteration_s / chosen.iteration_s:.2f}x faster")  # fmt: skip
    return "\n".join(lines)
