"""``distsim search grid``: DistSim's grid search over tensor x pipeline x data degrees (Sec. 6)."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from distsim.cli.common import (
    GB,
    TRACE_FORMATS,
    Progress,
    check_outputs,
    grad_sync_options,
    load_costs_for,
    parse_schedules,
    write_trace,
)
from distsim.cli.options import CommandArgs, CostOptions, Options, OutputOptions
from distsim.cli.search import SearchOptions, check_directory, model_and_gpus, opt_int_list, search, shared_options
from distsim.core.errors import DistsimError
from distsim.core.strategy import RECOMPUTE_MODES, SHARDING_MODES
from distsim.core.sync import DDP_BUCKET_CAP_MB


@search.command()
@shared_options
@click.option("--schedules", default="1f1b", show_default=True, metavar="LIST",
              help="Pipeline schedules to try: any of gpipe,1f1b,interleaved.")  # fmt: skip
@click.option("--micro-batch-sizes", default="1", show_default=True, metavar="LIST",
              help="Micro-batch sizes to try, e.g. 1,2,4,8.")  # fmt: skip
@click.option("--tp", "tp_text", metavar="LIST", help="Tensor-parallel degrees to try, e.g. 1,2,4,8. [default: all]")
@click.option("--pp", "pp_text", metavar="LIST", help="Pipeline degrees to try. [default: all]")
@click.option("--virtual-stages", type=click.IntRange(min=2), default=2, show_default=True,
              help="Model chunks per rank for the interleaved schedule.")  # fmt: skip
@grad_sync_options(framework=True)
@click.option("--recompute", "recompute_text", default="none", show_default=True, metavar="LIST",
              help="Activation recomputation modes to try: any of none,selective,full.")  # fmt: skip
@click.option("--optimizer-sharding", "sharding_text", default="none", show_default=True, metavar="LIST",
              help="Optimizer sharding modes to try: any of none,zero1,zero2,zero3 (with dp > 1).")  # fmt: skip
@click.option("--ep", "ep_text", default="1", show_default=True, metavar="LIST",
              help="Expert-parallel degrees to try (mixture-of-experts models), e.g. 1,2,4,8: each where it divides "
              "dp and the experts.")  # fmt: skip
@click.option(
    "--cp",
    "cp_text",
    default="1",
    show_default=True,
    metavar="LIST",
    help="Context-parallel degrees to try, e.g. 1,2,4: each where it divides dp and the sequence.",
)
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
              help="Write the Chrome/Perfetto trace, Gantt chart and plan of the best --top configs.")  # fmt: skip
@click.option("--trace-format", type=click.Choice(["json", "json.gz", "pftrace"]), default="json", show_default=True,
              help=f"Format of the --trace-best traces ({TRACE_FORMATS}).")  # fmt: skip
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
    from distsim.io.files import write_csv, write_figure
    from distsim.search.grid import grid_search
    from distsim.search.space import cluster_for

    args = GridArgs.from_params(**kw)
    outputs, ranking = args.outputs, args.ranking
    stdout_taken = check_outputs(outputs, {"csv_path": "--csv", "plan_out": "--plan-out"}, {"plot_path": "--plot"})
    check_directory(ranking.trace_dir, "--trace-best")
    model, cluster, gpus = model_and_gpus(args.search, args.costs)
    cluster = cluster_for(cluster, gpus)
    sizes = tuple(opt_int_list(args.grid.micro_batch_sizes, "--micro-batch-sizes") or (1,))
    costs_given = args.costs
    if model.micro_batch_size is not None:  # a profiled torch module: its example batch is the micro-batch
        sizes = (model.micro_batch_size,) if sizes == (1,) else sizes
        costs_given = costs_given.for_model(args.search.model_name)
    spec = args.grid.spec(gpus, args.search.global_batch, sizes)
    costs = load_costs_for(costs_given, cluster)
    workers = args.grid.workers or os.cpu_count() or 1
    progress = Progress(0, "configurations evaluated", enabled=not outputs.quiet)

    def report(done: int, total: int, point: Any) -> None:
        progress.total = total
        progress(done, total, point)

    result = grid_search(model, cluster, spec, costs, workers=workers, progress=report)
    table = result.table()
    if outputs.csv_path:
        write_csv(outputs.csv_path, table)
    if outputs.plot_path:
        from distsim.io.plots import search_bars

        ax = search_bars(
            table, title=f"{model.name} on {gpus} GPUs of {cluster.name}, global batch {spec.global_batch}"
        )
        ax.figure.tight_layout()
        write_figure(outputs.plot_path, ax.figure)
    best = result.best(max(1, ranking.top or len(result.points)))
    written = []
    if best and outputs.plan_out:
        written.append(_write_grid_plan(outputs.plan_out, result, point=best[0], rank=1, search=args.search))
    if ranking.trace_dir and best:
        written += _trace_best(result, best[: ranking.top or len(best)], costs, args)
    if outputs.as_json:
        data = result.to_dict()
        data["written"] = written
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(_grid_report(result, table, best, written, ranking, outputs.plan_out), err=bool(stdout_taken))


@dataclass(frozen=True)
class GridOptions(Options):
    """The configurations the grid visits, and the worker processes that simulate them."""

    schedules: str = "1f1b"
    micro_batch_sizes: str = "1"
    tp_text: str | None = None
    pp_text: str | None = None
    virtual_stages: int = 2
    grad_sync: str | None = None
    bucket_cap_mb: float | None = None
    recompute_text: str = "none"
    sharding_text: str = "none"
    ep_text: str = "1"
    cp_text: str = "1"
    uneven_stages: bool = False
    ignore_memory: bool = False
    workers: int | None = None

    def spec(self, gpus: int, global_batch: int, sizes: tuple[int, ...]) -> Any:
        """The search's :class:`~distsim.search.grid.GridSpec` (each list option checked)."""
        from distsim.search.grid import GridSpec

        return GridSpec(
            gpus=gpus,
            global_batch=global_batch,
            micro_batch_sizes=sizes,
            schedules=parse_schedules(self.schedules),
            tp_degrees=opt_int_list(self.tp_text, "--tp"),
            pp_degrees=opt_int_list(self.pp_text, "--pp"),
            virtual_stages=self.virtual_stages,
            grad_sync=self.grad_sync,
            recompute_modes=_modes(self.recompute_text, RECOMPUTE_MODES, "--recompute"),
            sharding_modes=_modes(self.sharding_text, SHARDING_MODES, "--optimizer-sharding"),
            ep_degrees=opt_int_list(self.ep_text, "--ep") or (1,),
            cp_degrees=opt_int_list(self.cp_text, "--cp") or (1,),
            bucket_cap_mb=self.bucket_cap_mb or DDP_BUCKET_CAP_MB,
            even_stages=not self.uneven_stages,
            memory_filter=not self.ignore_memory,
        )


@dataclass(frozen=True)
class RankingOptions(Options):
    """What is shown of the ranking (--top, --show-skipped) and the best configurations' files (--trace-best)."""

    top: int = 10
    show_skipped: bool = False
    trace_dir: str | None = None
    trace_format: str = "json"


@dataclass(frozen=True)
class GridArgs(CommandArgs):
    """The option groups of ``distsim search grid``."""

    search: SearchOptions
    costs: CostOptions
    outputs: OutputOptions
    grid: GridOptions
    ranking: RankingOptions


def _grid_report(result: Any, table: Any, best: list[Any], written: list[str], ranking: RankingOptions,
                 plan_out: str | None) -> str:  # fmt: skip
    import pandas as pd

    spec = result.spec
    lines = [_grid_header(result, spec)]
    if ranking.show_skipped and result.skipped:
        lines += ["skipped:", *(f"  {k}" for k in result.skipped), ""]
    if not len(table):
        lines.append("no valid configuration: --show-skipped says why each was skipped")
        return "\n".join(lines)
    top = ranking.top
    shown = table if not top else table.head(top)
    with pd.option_context("display.max_rows", None, "display.width", 250, "display.max_columns", None):
        lines.append(_format_table(shown).to_string(index=False))
    if top and len(table) > top:
        lines.append(f"... {len(table) - top} more (--top 0 shows all, --csv writes all)")
    if best:
        b = best[0]
        lines.append(f"\nbest: {b.strategy} ({b.strategy.describe()}): {b.iteration_time_s * 1e3:.2f} ms per "
                     f"iteration, {b.throughput(spec.global_batch):,.1f} samples/s")  # fmt: skip
    else:
        lines.append("\nno configuration fits in memory (--ignore-memory simulates them anyway)")
    lines += [f"wrote {path}" for path in written]
    if plan_out and best and plan_out != "-":
        lines.append(f"simulate the best plan: distsim simulate --plan {plan_out} --plot best.png")
    return "\n".join(lines)


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


def _write_grid_plan(path: str, result: Any, point: Any, rank: int, search: SearchOptions) -> str:
    from distsim.io.files import write_plan
    from distsim.plans import plan_from_strategy

    plan = plan_from_strategy(
        point.strategy, search.model_name, search.cluster_name, nodes=result.cluster.nodes,
        driver="distsim search grid", rank=rank, predicted_iteration_s=round(point.iteration_time_s, 9),
        global_batch=result.spec.global_batch,
    )  # fmt: skip
    write_plan(path, plan)
    return path


def _trace_best(result: Any, best: list[Any], costs: Any, args: GridArgs) -> list[str]:
    """Re-simulate the best configurations and write each one's trace, Gantt chart and plan. If a write fails,
    what this run created is removed again (the files it wrote new, and the directory if it made it); a file it
    replaced keeps its new content."""
    from distsim.io.files import write_figure
    from distsim.io.plots import gantt
    from distsim.plans.simulate import simulate

    directory = Path(args.ranking.trace_dir or "")
    made = [d for d in (directory, *directory.parents) if not d.exists()]  # the deepest first
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DistsimError(f"{directory}: cannot create ({exc.strerror})") from None
    written: list[str] = []
    created: list[Path] = []
    try:
        for rank, point in enumerate(best, start=1):
            s = point.strategy
            stem = directory / f"{rank:02d}-{s}-mbs{s.micro_batch_size}-{s.schedule}"
            paths = [f"{stem}.trace.{args.ranking.trace_format}", f"{stem}.png", f"{stem}.plan.yaml"]
            created += [Path(p) for p in paths if not os.path.lexists(p)]
            r = simulate(result.model, result.cluster, s, costs)
            title = f"{result.model.name} {s.describe()} on {result.cluster.name}"
            write_trace(paths[0], r.timeline, title, quiet=args.outputs.quiet)
            ax = gantt(r.timeline, title=f"#{rank} {title}: {r.iteration_time_s * 1e3:.1f} ms")
            write_figure(paths[1], ax.figure)
            _write_grid_plan(paths[2], result, point, rank, args.search)
            written += paths
    except BaseException:
        for path in created:
            path.unlink(missing_ok=True)
        for d in made:
            with contextlib.suppress(OSError):  # only if empty: never what something else put there meanwhile
                d.rmdir()
        raise
    return written


def _modes(text: str, allowed: tuple[str, ...], option: str) -> tuple[str, ...]:
    """A comma-separated list of mode names, each checked, in the order given (duplicates dropped)."""
    modes = tuple(dict.fromkeys(m.strip().lower() for m in text.split(",") if m.strip()))
    bad = [m for m in modes if m not in allowed]
    if bad or not modes:
        raise DistsimError(f"{option} {text!r}: choose from {', '.join(allowed)} (comma-separated)")
    return modes
