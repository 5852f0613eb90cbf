"""``distsim search deeppool``: DeepPool's burst-parallel planner, a GPU count per layer (Park et al. 2022, Sec. 4;
ALGORITHMS.md section 1)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import click

from distsim.cli.collocation import (
    BackgroundOptions,
    background_options,
    check_background,
    collocate_from_options,
    format_report,
)
from distsim.cli.common import check_outputs, fmt_time, load_costs_for
from distsim.cli.options import CommandArgs, CostOptions, Options, OutputOptions
from distsim.cli.search import SearchOptions, model_and_gpus, opt_int_list, search, shared_options

TOP_AMPLIFIED = 10
"""Layers the amplification table shows without --verbose (the most amplified)."""


@search.command()
@shared_options
@click.option("--amp-limit", type=float, default=2.0, show_default=True, metavar="X",
              help="GPU-sec amplification limit per layer: T g / (its compute time on one GPU) may not exceed X "
                   "(T includes the layer's incoming layout changes and gradient all-reduce).")  # fmt: skip
@click.option("--counts", "counts_text", metavar="LIST",
              help="Candidate GPU counts per layer, e.g. 1,2,3,4,6,8 (those above the global batch or --gpus are "
                   "dropped). [default: powers of two up to --gpus]")  # fmt: skip
@click.option("--placement", type=click.Choice(["prefix", "side-by-side"]), default="prefix", show_default=True,
              help="Where the written plan puts layers: on GPUs 0..g-1, as the planner prices every layout change, "
                   "or a block's branches on disjoint GPUs where they fit (they then run at once, but a narrow "
                   "layer's activations move to other GPUs, which the planner did not count).")  # fmt: skip
@click.option("--grad-sync", type=click.Choice(["bulk", "wfbp"]), default="bulk", show_default=True,
              help="The written plan's gradient all-reduces: after the whole backward (bulk, the planner's "
                   "no-overlap assumption) or each right after its layer's backward (wfbp).")  # fmt: skip
@click.option("--plan-out", default="deeppool.plan.yaml", show_default=True, metavar="FILE",
              help="Write the burst plan as a plan file ('' to skip).")  # fmt: skip
@click.option("--simulate/--no-simulate", default=True, show_default=True,
              help="Simulate the burst plan and plain data parallelism (GPUs doing the same work are simulated "
                   "once, exactly: both plans of Inception-v3 on 1024 GPUs take about 0.1 s).")  # fmt: skip
@click.option("--verbose", "-v", is_flag=True, help=f"The amplification of every layer, not the "
              f"{TOP_AMPLIFIED} most amplified.")  # fmt: skip
@click.option("--quiet", "-q", is_flag=True, help="Only the plan and the comparison, no tables.")
@background_options
def deeppool(**kw: Any) -> None:
    """DeepPool's planner: each layer data-parallel over its own number of GPUs (burst parallelism).

    The global batch is fixed (strong scaling); layer i runs on GPUs 0..g_i-1 with ceil(B/g_i) samples each. A
    dynamic programme over the layers (DeepPool's Algorithm 1) picks the counts that minimise the iteration time,
    counting each layer's compute, its gradient all-reduce over its GPUs and the cost of moving activations (and
    their gradients) between layers on different counts; a layer's GPU-seconds may grow to at most --amp-limit
    times its single-GPU compute. Branch/join blocks (Inception's modules) are reduced to one transition, their
    branches planned concurrently. Prints the counts, the planner's time and GPU-seconds, the same for plain data
    parallelism over all the GPUs, the simulator's prediction of both, and writes the plan (a burst plan file that
    `distsim simulate --plan` takes). Costs are DeepPool's runtime's (`--framework deeppool`: iterations replayed
    as CUDA graphs, no host time per kernel beyond the launch) unless --framework names another; `simulate --plan`
    charges a burst plan the same.

    \b
    VGG-16 on one 8-GPU DGX A100, global batch 32 (the paper's setting):
      distsim search deeppool --model vgg16 --cluster dgx-a100 --nodes 1 --global-batch 32
    Inception-v3 on 1024 GPUs (128 nodes), global batch 1024, a looser limit:
      distsim search deeppool --model inception-v3 --cluster dgx-a100 --nodes 128 --global-batch 1024 \\
          --amp-limit 4
    The plan with a background VGG-16 job at batch 4 in every GPU's idle time (DeepPool's collocation), against
    plain data parallelism and static partitions of the GPUs:
      distsim search deeppool --model vgg16 --cluster dgx-a100 --nodes 1 --global-batch 32 \\
          --background vgg16 --background-batch 4
    """
    from distsim.io.files import write_plan
    from distsim.search.deeppool import plan_deeppool
    from distsim.search.space import cluster_for

    args = DeeppoolArgs.from_params(**kw)
    outputs, planner = args.outputs, args.planner
    stdout_taken = check_outputs(outputs, {"plan_out": "--plan-out"})
    background = check_background(args.background)
    if background is not None and not planner.simulate:
        raise click.UsageError("--background collocates with the simulated plan; drop --no-simulate")
    model, cluster, gpus = model_and_gpus(args.search, args.costs)
    cluster = cluster_for(cluster, gpus)
    costs = load_costs_for(args.costs, cluster, "deeppool")  # DeepPool's runtime unless --framework says otherwise
    counts = opt_int_list(planner.counts_text, "--counts")
    result = plan_deeppool(model, cluster, costs, gpus, args.search.global_batch, counts, planner.amp_limit)
    place = {"placement": planner.placement, "grad_sync": planner.grad_sync, "model": args.search.model_name,
             "cluster": args.search.cluster_name}  # fmt: skip
    simulated = simulate_plans(result, costs, place) if planner.simulate else {}
    collocated = None
    if background is not None:  # before the plan is written: a background that cannot run is refused first
        from distsim.sim.flow.events import FlowOptions

        collocated = collocate_from_options(args.background, background, model, cluster, result.plan("best", **place),
                                            costs, FlowOptions(), None)  # fmt: skip
    written = []
    if outputs.plan_out:
        note: dict[str, object] = {"global_batch": result.batch}
        if "best" in simulated:
            note["predicted_iteration_s"] = round(simulated["best"], 9)
        written.append(str(write_plan(outputs.plan_out, result.plan("best", **place, **note))))
    if outputs.as_json:
        data = result.to_dict()
        data["simulated_s"] = {"plan": simulated.get("best"), "data_parallel": simulated.get("dp")}
        if collocated is not None:
            data["collocation"] = collocated.to_dict()
        data["placement"], data["grad_sync"], data["written"] = planner.placement, planner.grad_sync, written
        click.echo(json.dumps(data, indent=2))
        return
    lines = [report(result, simulated, verbose=planner.verbose, quiet=outputs.quiet)]
    if collocated is not None:
        lines += ["", format_report(collocated)]
    lines += [f"wrote {p}" for p in written]
    if written and outputs.plan_out != "-":
        lines.append(f"simulate it: distsim simulate --plan {outputs.plan_out} --plot deeppool.png")
    click.echo("\n".join(lines), err=bool(stdout_taken))


@dataclass(frozen=True)
class BurstOptions(Options):
    """What DeepPool's planner tries (--counts, within --amp-limit), how the plan is laid out and synchronised, and
    whether it is simulated and every layer shown."""

    amp_limit: float = 2.0
    counts_text: str | None = None
    placement: str = "prefix"
    grad_sync: str = "bulk"
    simulate: bool = True
    verbose: bool = False


@dataclass(frozen=True)
class DeeppoolArgs(CommandArgs):
    """The option groups of ``distsim search deeppool``."""

    search: SearchOptions
    costs: CostOptions
    outputs: OutputOptions
    planner: BurstOptions
    background: BackgroundOptions


def simulate_plans(result: Any, costs: Any, place: dict[str, str]) -> dict[str, float]:
    """The simulated iteration of the burst plan (``best``) and of plain data parallelism (``dp``), each when its
    flow is within the simulator's task limit."""
    from distsim.plans.simulate import DEFAULT_MAX_TASKS, estimate_size, simulate

    out = {}
    for which in ("best", "dp"):
        if which == "dp" and result.dp is None:
            continue
        plan = result.plan(which, **place)
        estimate = estimate_size(result.model, result.cluster, plan, costs)
        if estimate[0] <= DEFAULT_MAX_TASKS:  # estimated once: simulate() trusts it
            out[which] = simulate(result.model, result.cluster, plan, costs, estimate=estimate).iteration_time_s
    return out


def _gpus(g: int) -> str:
    return f"{g} GPU" + ("s" if g != 1 else "")


def warnings(result: Any) -> list[str]:
    """A line naming the layers over the amplification limit, and why the DP let them be."""
    best = result.best
    over = best.over_limit
    if not over:
        return []
    named = ", ".join(f"{best.names[i]} {best.amp[i]:.2f}" for i in over[:5]) + (", ..." if len(over) > 5 else "")
    last = len(best.names) - 1
    why = ("Algorithm 1 admits a layer's first (smallest) count as a predecessor whatever its amplification, its "
           "fallback for when every count breaks the limit, and keeps it unless a faster count is within the limit "
           "or less amplified" if any(i != last for i in over)
           else "the DP never checks the last layer's amplification")  # fmt: skip
    return [f"warning: {len(over)} layer(s) exceed the amplification limit {best.amp_limit:g} ({named}): {why}"]


def report(result: Any, simulated: dict[str, float] | None = None, verbose: bool = False, quiet: bool = False) -> str:
    best, dp, model, c = result.best, result.dp, result.model, result.cluster
    names = best.names
    dropped = f" ({','.join(map(str, result.dropped))} dropped: above the batch or the GPUs)" if result.dropped else ""
    lines = [
        f"{model.name} ({model.num_layers} layers) on {result.gpus} GPUs of {c.name} ({c.describe()}), global "
        f"batch {result.batch}; costs: {result.cost_source}; amplification limit {best.amp_limit:g}",
        f"candidate counts {','.join(map(str, best.counts))}{dropped}; planned in "
        f"{fmt_time(best.tables_s + best.planning_s)} (cost tables {fmt_time(best.tables_s)}, DP "
        f"{fmt_time(best.planning_s)})",
        "",
        "GPUs per layer:",
    ]
    for a, b, g in best.runs():
        span = f"layer {a}" if a == b else f"layers {a}-{b}"
        where = names[a] if a == b else f"{names[a]} .. {names[b]}"
        lines.append(f"  {span:<15} {_gpus(g):>9}  ({where})")
    simulated = simulated or {}
    lines += ["", f"{'':<24}{'planner':>12}{'GPU-seconds':>14}{'simulated':>12}{'samples/s':>12}"]
    rows = [("burst plan", "best", best)]
    if dp is not None:
        rows.append((f"data parallel x{result.gpus}", "dp", dp))
    for label, key, r in rows:
        sim = simulated.get(key)
        lines.append(f"  {label:<22}{fmt_time(r.time_s):>12}{fmt_time(r.gpu_seconds):>14}"
                     f"{fmt_time(sim) if sim else '-':>12}{result.batch / (sim or r.time_s):>12,.1f}")  # fmt: skip
    if dp is not None:
        ratio = f"{best.time_s / dp.time_s:.2f}x (planner)"
        if "best" in simulated and "dp" in simulated:
            ratio += f", {simulated['best'] / simulated['dp']:.2f}x (simulated)"
        lines.append(f"  burst plan / data parallelism: time {ratio}; GPU-seconds "
                     f"{best.gpu_seconds / dp.gpu_seconds:.2f}x")  # fmt: skip
    else:
        lines.append(f"  data parallelism over all {result.gpus} GPUs: not possible, the global batch "
                     f"({result.batch}) has fewer samples than GPUs")  # fmt: skip
    if simulated:
        lines += [
            "  samples/s from the simulated time. The simulator adds the optimizer step, which the planner",
            "  leaves out, and lets branches on shared GPUs take turns, which the planner counts as concurrent.",
        ]
    lines += ["", *warnings(result)] if best.over_limit else []
    if quiet:
        return "\n".join(lines)
    order = sorted(range(len(names)), key=lambda i: -best.amp[i])
    shown = sorted(order if verbose else order[:TOP_AMPLIFIED])
    title = "every layer" if verbose or len(names) <= TOP_AMPLIFIED else f"the {TOP_AMPLIFIED} most amplified"
    lines += ["", f"amplification, {title} (T: incoming layout changes + compute + all-reduce):"]
    width = max(len(names[i]) for i in shown)
    lines.append(f"  {'layer':>5}  {'name':<{width}}  {'GPUs':>5}  {'T':>10}  {'amp':>6}  {'DP amp':>6}")
    for i in shown:
        dp_amp = f"{dp.amp[i]:6.2f}" if dp is not None else f"{'-':>6}"
        flag = "  over the limit" if i in best.over_limit else ""
        lines.append(f"  {i:>5}  {names[i]:<{width}}  {best.gpus[i]:>5}  {fmt_time(best.layer_s[i]):>10}  "
                     f"{best.amp[i]:6.2f}  {dp_amp}{flag}")  # fmt: skip
    return "\n".join(lines)
