"""``distsim search merge``: MG-WFBP's merged-gradient plan for a data-parallel strategy, every gradient
synchronisation mode compared, and how each scales with the workers (Shi et al., TPDS; ALGORITHMS.md section 2)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click

from distsim.cli.common import (
    Progress,
    allreduce_option,
    check_outputs,
    framework_option,
    load_model_and_cluster,
    parse_int_list,
    strategy_overrides,
)
from distsim.cli.options import CommandArgs, CostOptions, Options, OutputOptions, StrategyOptions, TargetOptions
from distsim.cli.search import search
from distsim.core.collectives import analytic_algorithm
from distsim.core.errors import DistsimError
from distsim.core.sync import DDP_BUCKET_CAP_MB

MB = 1e6


def fmt_bytes(n: float) -> str:
    """Decimal megabytes, or kilobytes below 0.1 MB (a stem conv's gradients are 38 kB, not '0.0 MB')."""
    return f"{n / MB:.1f} MB" if n >= 0.1 * MB else f"{n / 1e3:.1f} kB"


def _modes_text() -> str:
    from distsim.core.sync import MODES

    return ",".join(MODES)


@search.command()
@click.option("--model", "-m", "model_name", required=True, metavar="NAME|FILE",
              help="Zoo model (see `distsim models`) or a YAML/JSON model file.")  # fmt: skip
@click.option("--cluster", "-c", "cluster_name", required=True, metavar="NAME|FILE",
              help="Cluster preset (see `distsim clusters`) or a YAML/JSON cluster file.")  # fmt: skip
@click.option("--nodes", type=click.IntRange(min=1), help="Override the cluster's node count.")
@click.option("--strategy", "-s", "strategy_text", metavar="xMyPzD",
              help="The strategy whose gradients are synchronised, with dp > 1 (2M4P2D or 'tp=2 pp=4 dp=2'). "
                   "[default: pure data parallelism over every GPU, 1M1P<N>D]")  # fmt: skip
@click.option("--micro-batches", type=click.IntRange(min=1), default=None,
              help="Micro-batches per iteration per replica (M). [default: 1]")  # fmt: skip
@click.option("--micro-batch-size", type=click.IntRange(min=1), default=None,
              help="Samples per micro-batch. [default: 1]")  # fmt: skip
@click.option("--bucket-cap-mb", type=click.FloatRange(min=0, min_open=True), default=None,
              help=f"DDP bucket size in MiB (the ddp mode). [default: {DDP_BUCKET_CAP_MB:g}]")  # fmt: skip
@click.option("--modes", "modes_text", default=None, metavar="LIST",
              help="Gradient synchronisation modes to compare (wfbp, the baseline, is always simulated). "
                   "[default: all of them]")  # fmt: skip
@click.option("--choose", type=click.Choice(["greedy", "optimal"]), default="greedy", show_default=True,
              help="Whose merge plan to write: MG-WFBP's greedy (its Algorithm 1) or the exact DP.")  # fmt: skip
@allreduce_option
@framework_option
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Profile database with measured event times. [default: analytic estimates]")  # fmt: skip
@click.option("--strict", is_flag=True, help="With --profile: fail on an event the profile lacks.")
@click.option(
    "--out",
    "plan_out",
    default="merge.plan.yaml",
    show_default=True,
    metavar="FILE",
    help="Write the chosen merge plan as a plan file (grad_sync mgwfbp with its layer groups; '' to skip).",
)
@click.option("--sweep-workers", "sweep_text", metavar="LIST",
              help="Also sweep pure data parallelism over these worker counts (e.g. 2,4,8,...,2048; the cluster is "
                   "resized to them) and print each mode's iteration time and speedup S(N).")  # fmt: skip
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="With --sweep-workers: speedup against workers per mode (PNG/SVG/PDF).")  # fmt: skip
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the comparison table, or with --sweep-workers the scaling table.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of the tables.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
def merge(**kw: Any) -> None:
    """MG-WFBP: merge layers' gradients into fewer all-reduces, and compare every way of synchronising them.

    Simulates the strategy under each gradient synchronisation mode (bulk = SyncEASGD, one all-reduce after
    backward; wfbp, one per layer as soon as it is ready; ddp, PyTorch's 25 MiB buckets; mgwfbp, the paper's greedy
    merge; mgwfbp-optimal, the exact merge) and prints iteration time, exposed communication per GPU, all-reduces and
    the speedup over WFBP. The chosen merge plan is printed as layer ranges with their gradient bytes and written as
    a plan file that `distsim simulate --plan` predicts the same iteration from. Layers are the model's graph layers
    (a transformer layer, a CNN block), not the parameter tensors the paper merges.

    \b
    ResNet-50 on 16 single-V100 nodes joined by 10 GbE, batch 32 per GPU:
      distsim search merge --model resnet50 --cluster v100-10gbe --micro-batch-size 32
    The paper's scaling simulation (ring all-reduce, 2 to 2048 workers), plotted:
      distsim search merge --model resnet50 --cluster v100-10gbe --micro-batch-size 32 --allreduce ring \\
          --sweep-workers 2,4,8,16,32,64,128,256,512,1024,2048 --plot scaling.png
    Then the chosen plan's timeline:
      distsim simulate --plan merge.plan.yaml --plot merge.png
    """
    from distsim.search.merge import PLANNERS, SWEEP_MODES, check_modes, cluster_of, compare_sync, sweep_workers

    args = MergeArgs.from_params(**kw)
    outputs, options = args.outputs, args.merge
    stdout_taken = check_outputs(outputs, {"plan_out": "--out", "csv_path": "--csv"}, {"plot_path": "--plot"})
    if outputs.plot_path and not options.sweep_text:
        raise DistsimError("--plot draws the --sweep-workers scaling: give --sweep-workers (the merge plan's timeline: "
                           "distsim simulate --plan PLAN --plot FILE)")  # fmt: skip
    sweep_counts = parse_int_list(options.sweep_text, "--sweep-workers") if options.sweep_text else ()
    modes = check_modes(x.strip() for x in options.modes_text.split(",") if x.strip()) if options.modes_text else None
    model, cluster = load_model_and_cluster(args.job, args.costs)
    for n in sweep_counts:  # a worker count the cluster's nodes cannot hold fails before any work
        cluster_of(cluster, n)
    strategy, costs_given = _strategy(args, model, cluster)
    costs_for = _costs_for(costs_given)
    planner = PLANNERS[options.choose]
    compared = modes if modes is None or planner in modes else (*modes, planner)
    comparison = compare_sync(model, cluster, strategy, costs_for(cluster), compared)
    chosen = comparison.chosen(options.choose)
    sweep = None
    if sweep_counts:
        sweep_modes = SWEEP_MODES if modes is None else tuple(r.mode for r in comparison.results)
        sweep_modes = sweep_modes if planner in sweep_modes else (*sweep_modes, planner)
        progress = Progress(0, "simulations of the worker sweep", enabled=not outputs.quiet and not outputs.as_json,
                            after_s=2.0)  # fmt: skip
        sweep = sweep_workers(model, cluster, sweep_counts, costs_for, sweep_modes, strategy.micro_batch_size,
                              strategy.num_micro_batches, strategy.bucket_cap_mb, progress=progress)  # fmt: skip
    written = _write_outputs(args, comparison, sweep)
    if outputs.as_json:
        data = {
            "comparison": comparison.to_dict(),
            "allreduce": args.costs.allreduce,
            "choose": options.choose,
            "chosen": {"mode": chosen.mode, "strategy": comparison.plan_strategy(options.choose).describe()},
            "sweep": sweep.to_dict() if sweep is not None else None,
            "written": written,
        }
        click.echo(json.dumps(data, indent=2))
        return
    lines = [_report(comparison, args.costs.allreduce), "", *_plan_lines(comparison, options.choose)]
    if sweep is not None:
        lines += ["", *_sweep_lines(sweep, args.costs.allreduce)]
    lines += [f"wrote {path}" for path in written]
    if outputs.plan_out and outputs.plan_out != "-":
        allreduce = f" --allreduce {args.costs.allreduce}" if args.costs.allreduce != "nccl" else ""
        lines.append(f"simulate it: distsim simulate --plan {outputs.plan_out}{allreduce} --plot merge.png")
    click.echo("\n".join(lines), err=bool(stdout_taken))


@dataclass(frozen=True)
class MergeOptions(Options):
    """The modes compared (--modes), whose merge plan is written (--choose), and the worker sweep (--sweep-workers)."""

    modes_text: str | None = None
    choose: str = "greedy"
    sweep_text: str | None = None


@dataclass(frozen=True)
class MergeArgs(CommandArgs):
    """The option groups of ``distsim search merge``."""

    job: TargetOptions
    strategy: StrategyOptions
    costs: CostOptions
    outputs: OutputOptions
    merge: MergeOptions


def _strategy(args: MergeArgs, model: Any, cluster: Any) -> tuple[Any, CostOptions]:
    """--strategy with --micro-batches / --micro-batch-size / --bucket-cap-mb; default pure data parallelism. And the
    costs options (a profiled torch module's profile is its costs unless --profile is given)."""
    from distsim.core.strategy import Strategy

    overrides, _ = strategy_overrides(args.strategy)
    costs = args.costs
    if model.micro_batch_size is not None:  # a profiled torch module: its example batch is the micro-batch
        overrides.setdefault("micro_batch_size", model.micro_batch_size)
        costs = costs.for_model(args.job.model_name)
    text = args.job.strategy_text or f"1M1P{cluster.num_gpus}D"
    return Strategy.from_str(text, **overrides), costs


def _costs_for(costs: CostOptions) -> Callable[[Any], Any]:
    """Costs for any size of the cluster (a sweep resizes it): analytic costs with the --allreduce algorithm, under
    the profile's measurements when --profile is given (the file is read once)."""
    from distsim.io.files import load_profile
    from distsim.sim.costs import AnalyticCosts, ProfileCosts

    allreduce = costs.allreduce
    if not costs.profile_path:
        if costs.strict:
            raise DistsimError("--strict needs --profile")
        return lambda cluster: AnalyticCosts(cluster, allreduce=allreduce)
    db = load_profile(costs.profile_path)
    return lambda cluster: ProfileCosts(db, AnalyticCosts(cluster, allreduce=allreduce), strict=costs.strict)


def _write_outputs(args: MergeArgs, comparison: Any, sweep: Any) -> list[str]:
    from distsim.io.files import write_csv, write_figure, write_plan
    from distsim.plans import plan_from_strategy

    outputs, choose, allreduce = args.outputs, args.merge.choose, args.costs.allreduce
    written = []
    if outputs.plan_out:
        chosen = comparison.chosen(choose)
        plan = plan_from_strategy(
            comparison.plan_strategy(choose), args.job.model_name, args.job.cluster_name,
            nodes=comparison.cluster.nodes, driver="distsim search merge", planner=choose,
            predicted_iteration_s=round(chosen.iteration_time_s, 9), allreduce=allreduce,
        )  # fmt: skip
        write_plan(outputs.plan_out, plan)
        written.append(outputs.plan_out)
    if outputs.csv_path:
        write_csv(outputs.csv_path, sweep.table() if sweep is not None else comparison.table())
        written.append(outputs.csv_path)
    if outputs.plot_path and sweep is not None:
        from distsim.io.plots import speedup_curves

        algorithm = analytic_algorithm(allreduce).describe()
        title = (f"{sweep.model.name}, {sweep.micro_batch_size} samples per GPU, on {sweep.cluster.name} nodes "
                 f"({algorithm})")  # fmt: skip
        ax = speedup_curves(sweep.table(), sweep.modes, title=title)
        ax.figure.tight_layout()
        write_figure(outputs.plot_path, ax.figure)
        written.append(outputs.plot_path)
    return written


def _report(comparison: Any, allreduce: str) -> str:
    c, s = comparison.cluster, comparison.strategy
    algorithm = analytic_algorithm(allreduce).describe()
    lines = [
        f"{comparison.model.name} on {c.name} ({c.describe()})",
        f"strategy {s} ({s.describe()}); costs: {comparison.cost_source}, {algorithm}",
        "",
        f"{'mode':<16} {'iteration ms':>12} {'exposed comm ms':>15} {'all-reduces':>11} {'vs wfbp':>8}",
    ]
    for r in comparison.results:
        lines.append(f"{r.mode:<16} {r.iteration_time_s * 1e3:>12.2f} {r.exposed_comm_s * 1e3:>15.2f} "
                     f"{r.allreduces:>11} {r.speedup_vs_wfbp:>7.3f}x")  # fmt: skip
    return "\n".join(lines)


def _plan_lines(comparison: Any, choose: str) -> list[str]:
    chosen = comparison.chosen(choose)
    how = "MG-WFBP's greedy, Algorithm 1" if choose == "greedy" else "exact, dynamic programme over contiguous groups"
    total = sum(g.nbytes for g in chosen.groups)
    s = comparison.strategy
    messages = sum(g.nbytes > 0 for g in chosen.groups)
    where = f" on {s.pp} pipeline ranks" if s.pp > 1 else ""
    shard = " per tensor-parallel shard" if s.tp > 1 else ""
    lines = [f"merge plan ({chosen.mode}: {how}): {messages} all-reduces of {fmt_bytes(total)}{shard} over "
             f"{comparison.model.num_layers} layers{where}, issued from the last layers down"]  # fmt: skip
    lines += [f"  {line}" for line in describe_groups(chosen.groups, comparison.model)]
    return lines


def describe_groups(groups: Sequence[Any], model: Any) -> list[str]:
    """Merge groups compactly, in layer order: ``layers 0-3 (stem .. layer1.2): 102.2 MB`` per merged group, and a
    run of single-layer groups as one line (``layers 4-9: one all-reduce each, 6 of 20.0 MB in all``)."""
    out: list[str] = []
    i = 0
    while i < len(groups):
        j = i
        while j < len(groups) and groups[j].num_layers == 1 and groups[j].nbytes > 0:
            j += 1
        if j - i >= 3:  # a run of single-layer all-reduces
            lo, hi = groups[i].layers[0], groups[j - 1].layers[1] - 1
            nbytes = sum(g.nbytes for g in groups[i:j])
            out.append(f"layers {lo}-{hi} ({model.layers[lo].name} .. {model.layers[hi].name}): one all-reduce each, "
                       f"{j - i} of {fmt_bytes(nbytes)} in all")  # fmt: skip
            i = j
            continue
        g = groups[i]
        lo, hi = g.layers[0], g.layers[1] - 1
        where = f"layer {lo} ({model.layers[lo].name})" if lo == hi else (
            f"layers {lo}-{hi} ({model.layers[lo].name} .. {model.layers[hi].name})")  # fmt: skip
        out.append(f"{where}: " + (fmt_bytes(g.nbytes) if g.nbytes else "no gradients"))
        i += 1
    return out


def _sweep_lines(sweep: Any, allreduce: str) -> list[str]:
    import pandas as pd

    algorithm = analytic_algorithm(allreduce).describe()
    table = sweep.table()
    shown = pd.DataFrame({"workers": table["workers"], "nodes": table["nodes"]})
    for m in sweep.modes:
        shown[f"{m} ms"] = [f"{x:.2f}" for x in table[f"{m}_ms"]]
    for m in sweep.modes:
        shown[f"S({m})"] = [f"{x:.1f}" for x in table[f"speedup_{m}"]]
    for col in table.columns:
        if col.endswith("/bulk"):
            shown[col] = [f"{x:.3f}" for x in table[col]]
    lines = [
        f"scaling: pure data parallelism over N GPUs of {sweep.cluster.name} nodes, {sweep.micro_batch_size} samples "
        f"per GPU x {sweep.num_micro_batches} micro-batch(es), {algorithm}; one GPU takes "
        f"{sweep.single_gpu_s * 1e3:.2f} ms per iteration (S(N) = N x that / iteration); {sweep.wall_time_s:.2f} s",
    ]
    with pd.option_context("display.width", 250, "display.max_columns", None):
        lines.append(shown.to_string(index=False))
    return lines
