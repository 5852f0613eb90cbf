"""``distsim cluster-sim``: a job trace on a heterogeneous GPU cluster under EasyScale's and YARN-CS's schedulers."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from distsim.cli.app import cli
from distsim.cli.common import FiniteFloatRange, Progress, check_outputs, parse_type_map
from distsim.cli.options import OutputOptions
from distsim.core.errors import DistsimError
from distsim.elastic.cluster_sim import DEFAULT_MAX_JOBS

DEFAULT_TRACE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "elastic", "data",
                             "synthetic-150.csv")  # fmt: skip
"""The shipped synthetic trace (package data, so the default works from any directory)."""
PROGRESS_AFTER_S = 3.0
"""A run that takes longer than this shows a progress line on stderr (0: always)."""
DEFAULT_GPUS = "V100:32,P100:16,T4:16"
COMPARED = ("yarn-cs", "easyscale-homo", "easyscale")
# EasyScale Sec. 5.2 (artifact CSV: mean JCT 8904.97 / 1070.50 / 676.75 s, makespan 16560 / 6720 / 6000 s)
PAPER_SPEEDUP = {"easyscale-homo": (8.3, 2.5), "easyscale": (13.2, 2.8)}
WHY = (
    "Why they differ: the paper's trace (Philly arrivals, Alibaba runtimes) is not published, so the synthetic one's "
    "load and runtimes are assumptions; YARN-CS gangs wait for the GPU type each job requires, and a job pinned to a "
    "slower type runs longer; EasyScale here rescales for free but never scales a job in or moves it off a slow GPU, "
    "so the last long job sets the makespan."
)


def parse_gpus(text: str) -> dict[str, int]:
    """'V100:32,P100:16,T4:16' -> {'V100': 32, 'P100': 16, 'T4': 16}: the types as the trace names them."""
    return parse_type_map(text, "--gpus", int, canonical=False, minimum=1)


HEADER = f"{'scheduler':<15} {'jobs':>5} {'JCT mean s':>10} {'p50 s':>9} {'p95 s':>9} {'makespan s':>11} {'alloc':>8}"


def _row(s: dict[str, Any]) -> str:
    return (f"{s['scheduler']:<15} {s['jobs']:>5} {s['jct_mean_s']:>10.0f} {s['jct_p50_s']:>9.0f} "
            f"{s['jct_p95_s']:>9.0f} {s['makespan_s']:>11.0f} {s['mean_allocation_ratio']:>8.1%}")  # fmt: skip


def comparison(summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """YARN-CS over each EasyScale variant: JCT and makespan ratios beside the paper's."""
    base = summaries.get("yarn-cs")
    if base is None:
        return []
    out = []
    for name, (paper_jct, paper_makespan) in PAPER_SPEEDUP.items():
        if name in summaries:
            s = summaries[name]
            out.append({"scheduler": name, "jct_ratio": base["jct_mean_s"] / s["jct_mean_s"],
                        "paper_jct_ratio": paper_jct, "makespan_ratio": base["makespan_s"] / s["makespan_s"],
                        "paper_makespan_ratio": paper_makespan})  # fmt: skip
    return out


def simulated_capabilities(cluster: dict[str, int], batch: int) -> tuple[Any, list[str]]:
    """A capability hook for :func:`~distsim.elastic.cluster_sim.simulate_cluster`: a job whose model is a zoo model
    gets C_i = 1 / its simulated one-GPU iteration on each of the cluster's GPU types (one simulation per model and
    type); the second item lists the models it simulated (filled as the hook runs)."""
    from distsim.core.models.zoo import ZOO, get_model
    from distsim.elastic.capability import capabilities
    from distsim.elastic.jobs import MIN_CAPABILITY

    cache: dict[str, dict[str, float] | None] = {}
    simulated: list[str] = []

    def hook(job: Any) -> Any:
        if job.model not in cache:
            cache[job.model] = None
            if job.model in ZOO:
                caps = capabilities(get_model(job.model), list(cluster), batch)
                for t, c in caps.items():
                    if not c.per_s >= MIN_CAPABILITY:
                        raise DistsimError(f"--simulate-capabilities {batch}: one {t} takes {c.iteration_s:,.0f} s "
                                           f"per mini-batch of {job.model}, under the least capability of "
                                           f"{MIN_CAPABILITY:g} mini-batches/s; give a smaller mini-batch")  # fmt: skip
                cache[job.model] = {t: c.per_s for t, c in caps.items()}
                simulated.append(job.model)
        return cache[job.model] if cache[job.model] is not None else job.capabilities

    return hook, simulated


def _after(progress: Progress, base: int, total: int) -> Any:
    """One scheduler's `progress(done, jobs)` as a share of all schedulers' runs: `base` jobs finished before it."""
    return lambda done, _jobs: progress(base + done, total)


@cli.command("cluster-sim")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Synthetic .csv or Philly cluster_job_log .json trace [default: the shipped synthetic-150.csv, "
                   "150 jobs, inside the distsim package].")  # fmt: skip
@click.option("--scheduler", type=click.Choice(["both", *COMPARED]), default="both", show_default=True,
              help="Inter-job scheduler; both: YARN-CS, EasyScale-homo and EasyScale side by side.")  # fmt: skip
@click.option("--gpus", default=DEFAULT_GPUS, show_default=True, help="GPUs per type, TYPE:COUNT,...")
@click.option("--round-s", type=FiniteFloatRange(min=1.0), default=60.0, show_default=True,
              help="Seconds between EasyScale's scheduling rounds while they grant GPUs.")  # fmt: skip
@click.option("--max-jobs", type=click.IntRange(min=1), default=DEFAULT_MAX_JOBS, show_default=True,
              help="Refuse a trace of more jobs than this, before simulating (the cost per job grows with the "
                   "queue: 20,000 overloaded jobs take about a minute under the three schedulers).")  # fmt: skip
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the JCT CDF and the GPU allocation ratio over time.")  # fmt: skip
@click.option("--simulate-capabilities", "simulated_batch", type=click.IntRange(min=1), metavar="BATCH",
              help="Each job's C_i per GPU type from the simulator instead of the trace: one GPU's iteration of its "
                   "model at this mini-batch size (analytic costs), for jobs whose model is a zoo model (distsim "
                   "models); the others keep the trace's figures.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def cluster_sim(trace_path: str | None, scheduler: str, gpus: str, round_s: float, max_jobs: int,
                plot_path: str | None, simulated_batch: int | None, as_json: bool) -> None:  # fmt: skip
    """Simulate a job trace on a GPU cluster: JCT (mean, p50, p95), makespan and GPU allocation ratio (EasyScale 5.2).

    \b
    Examples:
      distsim cluster-sim                                  # the shipped trace, all three schedulers
      distsim cluster-sim --scheduler easyscale --gpus V100:32,P100:16,T4:16 --plot cluster-sim.png
      distsim cluster-sim --trace cluster_job_log.json     # a Philly trace (not shipped: msr-fiddle/philly-traces)
    """
    from distsim.elastic.cluster_sim import simulate_cluster
    from distsim.elastic.jobs import read_trace

    check_outputs(OutputOptions(plot_path=plot_path, as_json=as_json), {}, {"plot_path": "--plot"})
    cluster = parse_gpus(gpus)
    jobs = read_trace(trace_path or DEFAULT_TRACE, max_jobs)
    names = COMPARED if scheduler == "both" else (scheduler,)
    hook, simulated = (None, []) if simulated_batch is None else simulated_capabilities(cluster, simulated_batch)
    total = len(names) * len(jobs)
    what = f"jobs finished ({len(names)} schedulers in turn)" if len(names) > 1 else f"jobs finished under {scheduler}"
    progress = Progress(total, what, after_s=PROGRESS_AFTER_S)
    results = [simulate_cluster(jobs, cluster, name, round_s=round_s, capability=hook, max_jobs=max_jobs,
                                progress=_after(progress, k * len(jobs), total))
               for k, name in enumerate(names)]  # fmt: skip
    summaries = {r.scheduler: r.summary() for r in results}
    ratios = comparison(summaries)
    if as_json:
        report = {"trace": trace_path or DEFAULT_TRACE, "gpus": cluster, "results": list(summaries.values()),
                  "vs_yarn_cs": ratios, "why_different": WHY if ratios else None}  # fmt: skip
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(f"{len(jobs)} jobs on {gpus}")
        if simulated_batch is not None:
            done = sorted(set(simulated))
            click.echo(f"capabilities simulated at mini-batch {simulated_batch} (analytic) for "
                       f"{', '.join(done) if done else 'no model'}; other models keep the trace's")  # fmt: skip
        click.echo(HEADER)
        for s in summaries.values():
            click.echo(_row(s))
        if ratios:
            click.echo("\nover YARN-CS      JCT (paper)      makespan (paper)")
            for r in ratios:
                click.echo(f"{r['scheduler']:<15} {r['jct_ratio']:>5.2f}x ({r['paper_jct_ratio']:>4.1f}x)   "
                           f"{r['makespan_ratio']:>5.2f}x ({r['paper_makespan_ratio']:.1f}x)")  # fmt: skip
            click.echo(f"\n{WHY}")
    if plot_path:
        from distsim.io.files import write_figure
        from distsim.io.plots import cluster_sim_figure

        write_figure(plot_path, cluster_sim_figure(results, title=f"{len(jobs)} jobs on {gpus}"))
