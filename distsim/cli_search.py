"""Command line: ``distsim search grid | dapple``: find a good way to train a model on a cluster."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from distsim.errors import DistsimError

GB = 1e9


def _int_list(text: str | None, option: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise DistsimError(f"{option} takes comma-separated integers, e.g. 1,2,4; got {text!r}") from None
    if not values or min(values) < 1:
        raise DistsimError(f"{option} takes positive integers, got {text!r}")
    return values


def _schedules(text: str) -> tuple[str, ...]:
    from distsim.strategy import SCHEDULES

    names = tuple(x.strip().lower() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in SCHEDULES and n != "dapple"]
    if not names or bad:
        raise DistsimError(f"--schedules takes a comma-separated subset of {','.join(SCHEDULES)}; got {text!r}")
    return tuple("1f1b" if n == "dapple" else n for n in names)


def _costs(cluster: Any, profile_path: str | None, strict: bool) -> Any:
    from distsim.costs import AnalyticCosts, ProfileCosts
    from distsim.io import load_profile

    costs = AnalyticCosts(cluster)
    if profile_path:
        return ProfileCosts(load_profile(profile_path), costs, strict=strict)
    if strict:
        raise DistsimError("--strict needs --profile")
    return costs


def _check_writable(*paths: str | None) -> None:
    """Fail before a long search, not after it, when an output cannot be written."""
    for p in paths:
        if p:
            directory = Path(p).parent if str(Path(p).parent) else Path(".")
            if not directory.is_dir():
                raise DistsimError(f"{p}: directory {directory} does not exist")


def _model_and_cluster(kw: dict[str, Any]) -> tuple[Any, Any, int]:
    """--model, --cluster (with --nodes) and the GPU count to plan for (--gpus, default all)."""
    from distsim.io import load_cluster, load_model

    model = load_model(kw["model_name"])
    cluster = load_cluster(kw["cluster_name"])
    if kw["nodes"]:
        cluster = cluster.with_nodes(kw["nodes"])
    return model, cluster, kw["gpus"] or cluster.num_gpus


class Progress:
    """A progress line on stderr: redrawn in place on a terminal, a line every 10% otherwise."""

    def __init__(self, total: int, what: str, enabled: bool = True):
        self.total, self.what, self.enabled = total, what, enabled
        self.tty = sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.next_mark = 0.1

    def __call__(self, done: int, total: int, *_: Any) -> None:
        if not self.enabled:
            return
        frac = done / total
        elapsed = time.perf_counter() - self.t0
        if self.tty:
            bar = "#" * int(30 * frac)
            eta = f", ~{elapsed / frac - elapsed:.0f} s left" if 0 < frac < 1 else ""
            click.echo(f"\r[{bar:<30}] {done}/{total} {self.what} ({elapsed:.1f} s{eta})", nl=False, err=True)
            if done == total:
                click.echo("", err=True)
        elif frac >= self.next_mark or done == total:
            click.echo(f"{done}/{total} {self.what} evaluated ({elapsed:.1f} s)", err=True)
            while self.next_mark <= frac:
                self.next_mark += 0.1


def _shared_options(f: Any) -> Any:
    options = [
        click.option("--model", "-m", "model_name", required=True, metavar="NAME|FILE",
                     help="Zoo model (see `distsim models`) or a YAML/JSON model file."),
        click.option("--cluster", "-c", "cluster_name", required=True, metavar="NAME|FILE",
                     help="Cluster preset (see `distsim clusters`) or a YAML/JSON cluster file."),
        click.option("--nodes", type=click.IntRange(min=1), help="Override the cluster's node count."),
        click.option("--gpus", type=click.IntRange(min=1),
                     help="GPUs to plan for (whole nodes, at most the cluster's). [default: all]"),
        click.option("--global-batch", type=click.IntRange(min=1), required=True,
                     help="Samples per iteration; every candidate trains exactly this many."),
        click.option("--profile", "profile_path", type=click.Path(dir_okay=False), metavar="FILE",
                     help="Profile database with measured event times. [default: analytic estimates]"),
        click.option("--strict", is_flag=True, help="With --profile: fail on an event the profile lacks."),
        click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of the table."),
    ]  # fmt: skip
    for option in reversed(options):
        f = option(f)
    return f


@click.group()
def search() -> None:
    """Search strategies with the simulator: DistSim's grid search or DAPPLE's planner.

    \b
    Examples:
      distsim search grid --model bert-exlarge --cluster distsim-a10 --global-batch 16
      distsim search dapple --model bert-exlarge --cluster dapple-a --global-batch 64
    Both write the best plan as a file that `distsim simulate --plan FILE` simulates.
    """


@search.command()
@_shared_options
@click.option("--schedules", default="1f1b", show_default=True, metavar="LIST",
              help="Pipeline schedules to try: any of gpipe,1f1b,interleaved.")  # fmt: skip
@click.option("--micro-batch-sizes", default="1", show_default=True, metavar="LIST",
              help="Micro-batch sizes to try, e.g. 1,2,4,8.")  # fmt: skip
@click.option("--tp", "tp_text", metavar="LIST", help="Tensor-parallel degrees to try, e.g. 1,2,4,8. [default: all]")
@click.option("--pp", "pp_text", metavar="LIST", help="Pipeline degrees to try. [default: all]")
@click.option("--virtual-stages", type=click.IntRange(min=2), default=2, show_default=True,
              help="Model chunks per rank for the interleaved schedule.")  # fmt: skip
@click.option("--grad-sync", type=click.Choice(["bulk", "wfbp"]), default="bulk", show_default=True,
              help="Gradient all-reduce: after backward (DistSim) or per layer, overlapped (WFBP).")  # fmt: skip
@click.option("--uneven-stages", is_flag=True,
              help="Also try pipeline degrees that do not divide the transformer layer count.")  # fmt: skip
@click.option("--ignore-memory", is_flag=True, help="Simulate configurations that do not fit in memory too.")
@click.option("--top", type=click.IntRange(min=0), default=10, show_default=True,
              help="Rows of the ranked table to print (0: all).")  # fmt: skip
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), metavar="FILE", help="Write the whole table.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Bar chart of throughput per configuration (OOM at zero), PNG/SVG/PDF.")  # fmt: skip
@click.option("--plan-out", default="grid-best.plan.yaml", show_default=True, metavar="FILE",
              help="Write the best configuration as a plan file ('' to skip).")  # fmt: skip
@click.option("--trace-best", "trace_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="Write the Chrome trace, Gantt chart and plan of the best --top configurations.")  # fmt: skip
@click.option("--show-skipped", is_flag=True, help="List every skipped combination and why.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes. [default: the CPU count]")  # fmt: skip
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
def grid(**kw: Any) -> None:
    """Grid search over tensor x pipeline x data degrees, micro-batch sizes and schedules (DistSim Sec. 6).

    Every valid configuration for the GPUs is checked for memory; those that fit are simulated (in parallel) and
    ranked by iteration time. Configurations that do not fit score zero throughput and rank last.

    \b
    DistSim's use case (BERT-exLarge, 48 layers, on 4 x 4 A10, global batch 16; 15 settings):
      distsim search grid --model bert-exlarge --cluster distsim-a10 --global-batch 16 --plot grid.png
    GPT-3 175B on 1024 A100s:
      distsim search grid --model gpt3-175b --cluster dgx-a100 --global-batch 1536 --tp 1,2,4,8 \\
          --micro-batch-sizes 1,2,4,8 --schedules gpipe,1f1b,interleaved
    """
    import pandas as pd

    from distsim.io import write_csv, write_figure
    from distsim.search.grid import GridSpec, grid_search
    from distsim.search.space import cluster_for

    _check_writable(kw["csv_path"], kw["plot_path"], kw["plan_out"])
    model, cluster, gpus = _model_and_cluster(kw)
    cluster = cluster_for(cluster, gpus)
    spec = GridSpec(
        gpus=gpus,
        global_batch=kw["global_batch"],
        micro_batch_sizes=_int_list(kw["micro_batch_sizes"], "--micro-batch-sizes") or (1,),
        schedules=_schedules(kw["schedules"]),
        tp_degrees=_int_list(kw["tp_text"], "--tp"),
        pp_degrees=_int_list(kw["pp_text"], "--pp"),
        virtual_stages=kw["virtual_stages"],
        grad_sync=kw["grad_sync"],
        even_stages=not kw["uneven_stages"],
        memory_filter=not kw["ignore_memory"],
    )
    costs = _costs(cluster, kw["profile_path"], kw["strict"])
    workers = kw["workers"] or os.cpu_count() or 1
    progress = Progress(0, "configurations", enabled=not kw["quiet"])

    def report(done: int, total: int, point: Any) -> None:
        progress.total = total
        progress(done, total, point)

    result = grid_search(model, cluster, spec, costs, workers=workers, progress=report)
    table = result.table()
    if kw["csv_path"]:
        write_csv(kw["csv_path"], table)
    if kw["plot_path"]:
        from distsim.plots import search_bars

        ax = search_bars(
            table, title=f"{model.name} on {gpus} GPUs of {cluster.name}, global batch {spec.global_batch}"
        )
        ax.figure.tight_layout()
        write_figure(kw["plot_path"], ax.figure)
    best = result.best(max(1, kw["top"] or len(result.points)))
    written = []
    if best and kw["plan_out"]:
        written.append(_write_grid_plan(kw["plan_out"], result, best[0], 1, kw))
    if kw["trace_dir"] and best:
        written += _trace_best(result, best[: kw["top"] or len(best)], costs, kw)
    if kw["as_json"]:
        data = result.to_dict()
        data["written"] = written
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(_grid_header(result, spec))
    if kw["show_skipped"] and result.skipped:
        click.echo("skipped:")
        for k in result.skipped:
            click.echo(f"  {k}")
        click.echo("")
    if not len(table):
        click.echo("no valid configuration: --show-skipped says why each was skipped")
        return
    shown = table if not kw["top"] else table.head(kw["top"])
    with pd.option_context("display.max_rows", None, "display.width", 250, "display.max_columns", None):
        click.echo(_format_table(shown).to_string(index=False))
    if kw["top"] and len(table) > kw["top"]:
        click.echo(f"... {len(table) - kw['top']} more (--top 0 shows all, --csv writes all)")
    if best:
        b = best[0]
        click.echo(f"\nbest: {b.strategy} ({b.strategy.describe()}): {b.iteration_time_s * 1e3:.2f} ms per iteration, "
                   f"{b.throughput(spec.global_batch):,.1f} samples/s")  # fmt: skip
    else:
        click.echo("\nno configuration fits in memory (--ignore-memory simulates them anyway)")
    for path in written:
        click.echo(f"wrote {path}")
    if kw["plan_out"] and best:
        click.echo(f"simulate the best plan: distsim simulate --plan {kw['plan_out']} --plot best.png")


def _grid_header(result: Any, spec: Any) -> str:
    c = result.cluster
    n_valid, n_oom = len(result.points), result.num_out_of_memory
    lines = [
        f"{result.model.name} on {spec.gpus} GPUs of {c.name} ({c.describe()}), global batch {spec.global_batch}",
        f"{n_valid} valid configurations ({len(result.skipped)} combinations skipped"
        + ("" if not result.skipped else "; --show-skipped says why")
        + f"), {n_oom} do not fit in {c.gpu.memory_bytes / GB:.0f} GB"
        + (" (not simulated)" if spec.memory_filter else "")
        + f", {result.num_simulated} simulated in {result.wall_time_s:.1f} s with {result.workers} worker"
        + ("s" if result.workers > 1 else "")
        + f"; costs: {result.cost_source}",
        "",
    ]
    return "\n".join(lines)


def _format_table(df: Any) -> Any:
    out = df.drop(columns=["index"]).copy()
    out["iteration_s"] = [("-" if x != x else f"{x:.4g}") for x in out["iteration_s"]]
    out["samples_per_s"] = [f"{x:,.1f}" for x in out["samples_per_s"]]
    if "tokens_per_s" in out:
        out["tokens_per_s"] = [f"{x:,.0f}" for x in out["tokens_per_s"]]
    out["bubble"] = [("-" if x != x else f"{100 * x:.1f}%") for x in out["bubble"]]
    out["exposed_comm_s"] = [("-" if x != x else f"{x:.3g}") for x in out["exposed_comm_s"]]
    out["peak_memory_gb"] = [f"{x:.1f}" for x in out["peak_memory_gb"]]
    out["fits"] = ["yes" if x else "OOM" for x in out["fits"]]
    return out.rename(columns={"micro_batches": "M", "peak_memory_gb": "peak_mem_GB", "exposed_comm_s": "exp_comm_s"})


def _write_grid_plan(path: str, result: Any, point: Any, rank: int, kw: dict[str, Any]) -> str:
    from distsim.io import write_plan
    from distsim.plan import plan_from_strategy

    plan = plan_from_strategy(
        point.strategy, kw["model_name"], kw["cluster_name"], nodes=result.cluster.nodes,
        driver="distsim search grid", rank=rank, predicted_iteration_s=round(point.iteration_time_s, 9),
        global_batch=result.spec.global_batch,
    )  # fmt: skip
    write_plan(path, plan)
    return path


def _trace_best(result: Any, best: list[Any], costs: Any, kw: dict[str, Any]) -> list[str]:
    """Re-simulate the best configurations and write each one's trace, Gantt chart and plan."""
    from distsim.io import write_chrome_trace, write_figure
    from distsim.plots import gantt
    from distsim.simulate import simulate

    directory = Path(kw["trace_dir"])
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DistsimError(f"{directory}: cannot create ({exc.strerror})") from None
    written = []
    for rank, point in enumerate(best, start=1):
        s = point.strategy
        stem = directory / f"{rank:02d}-{s}-mbs{s.micro_batch_size}-{s.schedule}"
        r = simulate(result.model, result.cluster, s, costs)
        title = f"{result.model.name} {s.describe()} on {result.cluster.name}"
        write_chrome_trace(f"{stem}.trace.json", r.timeline.chrome_trace_events(), title)
        ax = gantt(r.timeline, title=f"#{rank} {title}: {r.iteration_time_s * 1e3:.1f} ms")
        write_figure(f"{stem}.png", ax.figure)
        written += [f"{stem}.trace.json", f"{stem}.png", _write_grid_plan(f"{stem}.plan.yaml", result, point, rank, kw)]
    return written


def _policies(text: str) -> tuple[str, ...]:
    from distsim.search.dapple import POLICIES

    names = tuple(x.strip().lower() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in POLICIES]
    if not names or bad:
        raise DistsimError(f"--policies takes a comma-separated subset of {','.join(POLICIES)}; got {text!r}")
    return tuple(dict.fromkeys(names))


@search.command()
@_shared_options
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
              help="Chrome/Perfetto trace of the chosen plan's simulated iteration.")  # fmt: skip
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
    from distsim.io import write_chrome_trace, write_figure, write_plan
    from distsim.search.dapple import DappleSpec, check_with_simulator, plan_dapple
    from distsim.simulate import simulate

    _check_writable(kw["plan_out"], kw["trace_path"], kw["plot_path"])
    model, cluster, gpus = _model_and_cluster(kw)
    spec = DappleSpec(
        gpus=gpus,
        global_batch=kw["global_batch"],
        micro_batches=_int_list(kw["micro_batches_text"], "--micro-batches"),
        schedule=kw["schedule"],
        warmup_policy="A" if kw["warmup_policy"] == "best" else kw["warmup_policy"],
        max_in_flight=kw["max_in_flight"],
        policies=_policies(kw["policies_text"]),
        memory_filter=not kw["ignore_memory"],
        beam=kw["beam"],
    )
    costs = _costs(cluster, kw["profile_path"], kw["strict"])
    quiet = kw["quiet"]
    progress = Progress(0, "micro-batch counts planned", enabled=not quiet)
    workers = kw["workers"] or os.cpu_count() or 1
    result = plan_dapple(model, cluster, spec, costs, progress=lambda d, t, _m: progress(d, t), workers=workers)
    policies = ("A", "B") if kw["warmup_policy"] == "best" else (spec.warmup_policy,)
    checking = Progress(0, "shortlisted plans simulated", enabled=not quiet)
    checked = check_with_simulator(result, costs, policies, progress=lambda d, t, _m: checking(d, t))
    chosen = None
    if checked:
        if kw["choose"] == "simulator":
            chosen = min(checked, key=lambda c: (c.iteration_s, c.candidate.latency_s))
        else:
            chosen = min(checked, key=lambda c: (c.candidate.latency_s, c.iteration_s))
    written = []
    if chosen is not None:
        best = chosen.candidate
        plan = result.plan(
            best, model=kw["model_name"], cluster=kw["cluster_name"], warmup_policy=chosen.policy,
            driver="distsim search dapple", planner_estimate_s=round(best.latency_s, 9),
            predicted_iteration_s=round(chosen.iteration_s, 9), global_batch=spec.global_batch,
        )  # fmt: skip
        if kw["plan_out"]:
            written.append(str(write_plan(kw["plan_out"], plan)))
        if kw["trace_path"] or kw["plot_path"]:
            r = simulate(model, result.cluster, result.plan(best, warmup_policy=chosen.policy), costs)
            title = f"{model.name} {best.notation} (M={best.micro_batches}) on {result.cluster.name}"
            if kw["trace_path"]:
                write_chrome_trace(kw["trace_path"], r.timeline.chrome_trace_events(), title)
                written.append(kw["trace_path"])
            if kw["plot_path"]:
                from distsim.plots import gantt

                ax = gantt(r.timeline, title=f"{title}: {r.iteration_time_s * 1e3:.1f} ms")
                write_figure(kw["plot_path"], ax.figure)
                written.append(kw["plot_path"])
    if kw["as_json"]:
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
        data["choose"] = kw["choose"]
        data["written"] = written
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(_dapple_report(result, checked, chosen, kw["choose"]))
    for path in written:
        click.echo(f"wrote {path}")
    if kw["plan_out"] and chosen is not None:
        click.echo(f"simulate it: distsim simulate --plan {kw['plan_out']} --plot dapple.png")


def _dapple_report(result: Any, checked: list[Any], chosen: Any, choose: str) -> str:
    import pandas as pd

    from distsim.plan import format_devices

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
