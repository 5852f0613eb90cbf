"""``distsim simulate``: one training iteration of a strategy or plan, summarised, with trace, CSV and Gantt chart."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import click

from distsim.cli.app import cli
from distsim.cli.collocation import (
    BackgroundOptions,
    background_options,
    check_background,
    collocate_from_options,
    format_report,
)
from distsim.cli.common import (
    GB,
    TRACE_FORMATS,
    Progress,
    RegistryChoice,
    allreduce_option,
    check_outputs,
    fmt_time,
    framework_option,
    grad_sync_options,
    load_costs,
    load_costs_for,
    load_framework_for,
    load_model_and_cluster,
    load_plan_for,
    parse_stragglers,
    scale_options,
    strategy_overrides,
    write_trace,
)
from distsim.cli.megatron_job import (
    JobSourceOptions,
    job_source_options,
    megatron_framework,
    megatron_report,
    megatron_strategy,
    read_megatron,
    with_global_batch,
)
from distsim.cli.options import (
    CommandArgs,
    CostOptions,
    Options,
    OutputOptions,
    RankTraceOptions,
    StrategyOptions,
    TargetOptions,
    rank_trace_options,
)
from distsim.core.errors import DistsimError
from distsim.core.schedules import SCHEDULES
from distsim.infra.self_check import device_mismatch
from distsim.plans.kinds import PLAN_KINDS
from distsim.plans.simulate import DEFAULT_MAX_TASKS, check_size, estimate_size
from distsim.sim.flow.events import LINK_SHARING


@cli.command()
@click.option(
    "--model",
    "-m",
    "model_name",
    metavar="NAME|FILE",
    help="Zoo model (see `distsim models`; e.g. llama3-70b:precision=fp8, or transformer:layers=..,hidden=..), a "
    "YAML/JSON model file, or hf:PATH (a Hugging Face config.json: gpt2, llama, mistral, qwen2). [default with "
    "--plan: the plan's]",
)
@click.option(
    "--cluster",
    "-c",
    "cluster_name",
    metavar="NAME|FILE",
    help="Cluster preset (see `distsim clusters`) or a YAML/JSON cluster file. [default with --plan: the plan's]",
)
@click.option("--nodes", type=click.IntRange(min=1), help="Override the cluster's node count.")
@click.option(
    "--strategy",
    "-s",
    "strategy_text",
    metavar="xMyPzD",
    help="Degrees in DistSim notation (2M4P2D = tp 2, pp 4, dp 2) or 'tp=2 pp=4 dp=2'.",
)
@click.option(
    "--plan",
    "plan_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="A plan file (YAML/JSON) instead of --strategy: a strategy, stages with their own layer ranges and "
    "devices, or a burst plan (kind: burst, batch: B, counts: '1x3,8x10' = GPUs x layers, or layers: one GPU count "
    "or {gpus: '0-3'} per layer); what `distsim search` writes.",
)
@click.option(
    "--micro-batches",
    "micro_batches",
    type=click.IntRange(min=1),
    default=None,
    help="Micro-batches per iteration per replica (M). [default: 1]",
)
@click.option(
    "--micro-batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Samples per micro-batch. [default: 1]",
)
@click.option(
    "--schedule",
    type=RegistryChoice(SCHEDULES),
    default=None,
    help="Pipeline schedule. [default: 1f1b]",
)
@click.option(
    "--virtual-stages",
    type=click.IntRange(min=2),
    help="Model chunks per rank for --schedule interleaved. [default: 2]",
)
@click.option(
    "--policy",
    type=click.Choice(["A", "B"], case_sensitive=False),
    default=None,
    help="DAPPLE 1F1B warm-up: A, K_i=min(S-i,D); B, K_i=min(2(S-i)-1,D). [default: A]",
)
@click.option("--max-in-flight", type=click.IntRange(min=1), help="DAPPLE's D: most micro-batches a stage holds.")
@grad_sync_options(framework=True)
@scale_options
@click.option("--partition", metavar="N:N:...", help="Layers per (virtual) stage, e.g. 23:25. [default: balanced]")
@click.option(
    "--p2p",
    "p2p_mode",
    type=click.Choice(["nonblocking", "blocking"]),
    default="nonblocking",
    show_default=True,
    help="blocking: a send occupies the sender's compute stream (DistSim Algorithm 1).",
)
@click.option(
    "--link-sharing",
    type=click.Choice(list(LINK_SHARING)),
    default="structural",
    show_default=True,
    help="structural: traffic kinds overlap, concurrent flows split NICs (optimistic); serialize: all traffic of a "
    "scope on a GPU queues on one link, p2p holding both ends (pessimistic); fair: inter-node transfers of any kind "
    "share each node's NICs equally while, and only while, they overlap (SimPy, slower).",
)
@click.option("--rank-order", default="tp,dp,pp", show_default=True, help="Rank placement, innermost first.")
@click.option(
    "--host",
    "host_mode",
    type=click.Choice(["auto", "on", "off"]),
    default="auto",
    show_default=True,
    help="Model each GPU's host enqueuing its kernels (a kernel starts no earlier than its launch; the host waits "
    "for received data and for the gradients before the optimizer step). auto: when kernels cost host time to "
    "launch (GPU clusters, or a profile that measured launches).",
)
@click.option(
    "--straggler",
    multiple=True,
    metavar="GPU=FACTOR",
    help="Make a GPU's compute FACTOR x slower (repeatable).",
)
@click.option("--full", is_flag=True, help="Simulate every GPU even when replicas are symmetric.")
@click.option("--samples", type=click.IntRange(min=0), default=0, show_default=True,
              help="Stochastic simulation: runs with durations drawn from the profile's repetitions (0: one run "
              "with mean durations).")  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --samples.")
@click.option("--max-tasks", type=click.IntRange(min=1), default=DEFAULT_MAX_TASKS, show_default=True,
              help="Refuse a simulation of more tasks than this (event-flow tasks x --samples runs; a task takes "
              "about 0.5-0.7 KB and 10 us), before building anything.")  # fmt: skip
@click.option(
    "--profile",
    "profile_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Profile database (JSON) with measured event times. [default: analytic estimates]",
)
@click.option(
    "--strict",
    is_flag=True,
    help="With --profile: fail if an event was not profiled instead of estimating it.",
)
@allreduce_option
@framework_option
@job_source_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of the summary.")
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help=f"Write a Chrome/Perfetto trace, in the format its name gives ({TRACE_FORMATS}).",
)
@rank_trace_options("the simulated iteration (every GPU its own rank)")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Write a Gantt chart (PNG/SVG/PDF).",
)
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), metavar="FILE", help="Write the timeline as CSV.")
@click.option(
    "--table",
    "table_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Write the timeline as a table in the format its name gives: *.parquet (dtypes kept, categoricals "
    "included; needs pyarrow), *.csv or *.csv.gz (as --csv).",
)
@click.option(
    "--all-gpus",
    is_flag=True,
    help="Write every GPU's rows to --trace/--csv/--table (default: one row set per group of identical GPUs); large: "
    "prefer a *.pftrace trace.",
)
@click.option("--show-schedule", is_flag=True, help="Also print the schedule as a step x rank grid.")
@background_options
def simulate(**kw: Any) -> None:
    """Simulate one training iteration and summarise it.

    \b
    Example (GPT-2 345M on DistSim's 16-GPU testbed, 1F1B with 8 micro-batches):
      distsim simulate --model gpt2-345m --cluster distsim-testbed --strategy 2M4P2D \\
          --micro-batches 8 --schedule 1f1b --trace gpt2.json --plot gpt2.png
    A plan written by `distsim search` (stages may differ in layers and replicas):
      distsim simulate --plan dapple.plan.yaml --plot dapple.png
    A burst plan (DeepPool: each layer on its own GPUs; the chart shows who idles):
      distsim simulate --plan burst.plan.yaml --plot burst.png
      # burst.plan.yaml (or layers: one GPU count or {gpus: "0-3"} per layer, instead of counts)
      kind: burst
      model: vgg16
      cluster: dgx-a100
      nodes: 1
      batch: 32
      counts: 1x3,8x10,1x8    # 3 layers on GPU 0, 10 on GPUs 0-7, 8 on GPU 0
    With a background job (ResNet-50 at batch 8) in every GPU's idle time (DeepPool's collocation):
      distsim simulate --plan burst.plan.yaml --background resnet50 --background-batch 8
    Open the trace in https://ui.perfetto.dev (one process per GPU, one thread per stream).
    """
    args = SimulateArgs.from_params(**kw)
    stdout_taken = check_outputs(args.outputs, {"trace_path": "--trace", "csv_path": "--csv", "table_path": "--table"},
                                 {"plot_path": "--plot"})  # fmt: skip
    if args.outputs.table_path:
        from distsim.io.table import check_table

        check_table(args.outputs.table_path)
    args.rank_traces.check()
    megatron, job = _megatron(args.job, args.source)
    plan, job = _plan_or_strategy(job)
    model, cluster = load_model_and_cluster(job, args.costs)
    background = check_background(args.background, args.simulation.samples)
    if args.simulation.straggler:
        cluster = cluster.with_slowdown(parse_stragglers(args.simulation.straggler))
    costs_given = args.costs.for_model(job.model_name)  # a torch module's profile: its events go with its graph
    target = _target(plan, job, model, args.strategy, megatron, cluster.num_gpus)
    if plan is None:
        target = with_global_batch(target, args.strategy.global_batch, strategy_overrides(args.strategy)[1])
    runtime = getattr(PLAN_KINDS[plan.kind], "framework", None) if plan is not None else None  # optional on a kind
    if megatron is not None:  # the launch line's overlap switches on the framework
        framework = megatron_framework(megatron, load_framework_for(costs_given))
        costs = load_costs(cluster, costs_given.profile_path, costs_given.strict, costs_given.allreduce, framework)
        click.echo(megatron_report(megatron), err=True)
    else:
        costs = load_costs_for(costs_given, cluster, runtime)
    if plan is None and not _sync_given(job, args.strategy):
        from distsim.sim.costs import framework_of

        target = framework_of(costs).synchronised(target, model.precision.grad_bytes)
    strategy = target.strategy if plan is not None else target
    options = args.simulation.flow_options()
    result = _run(model, cluster, target, costs, options, args.simulation, job.plan_path if plan is not None else None)
    if strategy.pp > 1 and strategy.num_micro_batches < strategy.pp and not args.outputs.as_json:
        click.echo(
            f"note: {strategy.num_micro_batches} micro-batch(es) for {strategy.pp} pipeline stages leaves most "
            "of the pipeline idle; pass --micro-batches",
            err=True,
        )
    collocated = None
    if background is not None:  # before any output is written: a background that cannot run is refused first
        collocated = collocate_from_options(args.background, background, model, cluster, target, costs, options,
                                            result, max_tasks=args.simulation.max_tasks)  # fmt: skip
    _write_outputs(result, args.outputs)
    _write_rank_traces(result, args.rank_traces)
    _report(result, job, costs_given, costs, collocated, args.outputs, stdout_taken)


@dataclass(frozen=True)
class SimulationOptions(Options):
    """How the iteration is simulated: --p2p, --link-sharing, --rank-order, --host, --straggler, --full, and the
    stochastic runs (--samples, --seed) within --max-tasks."""

    p2p_mode: str = "nonblocking"
    link_sharing: str = "structural"
    rank_order: str = "tp,dp,pp"
    host_mode: str = "auto"
    straggler: tuple[str, ...] = ()
    full: bool = False
    samples: int = 0
    seed: int = 0
    max_tasks: int = DEFAULT_MAX_TASKS

    def flow_options(self) -> Any:
        from distsim.sim.flow.events import FlowOptions

        return FlowOptions(
            p2p_blocking=self.p2p_mode == "blocking",
            symmetric=False if self.full else None,
            rank_order=self.rank_order,
            link_sharing=self.link_sharing,
            host={"auto": None, "on": True, "off": False}[self.host_mode],
        )


@dataclass(frozen=True)
class SimulateArgs(CommandArgs):
    """The option groups of ``distsim simulate``."""

    job: TargetOptions
    source: JobSourceOptions
    strategy: StrategyOptions
    simulation: SimulationOptions
    costs: CostOptions
    outputs: OutputOptions
    background: BackgroundOptions
    rank_traces: RankTraceOptions


def _plan_or_strategy(job: TargetOptions) -> tuple[Any, TargetOptions]:
    """The --plan (None with --strategy), and the job with the plan's model, cluster and nodes where not given."""
    plan = None
    if job.plan_path:
        plan, job = load_plan_for(job)
    elif not job.strategy_text:
        raise click.UsageError("give --strategy (e.g. 2M4P2D) or --plan FILE")
    if not job.model_name or not job.cluster_name:
        raise click.UsageError("give --model and --cluster (or a --plan that names them)")
    return plan, job


def _sync_given(job: TargetOptions, given_options: StrategyOptions) -> bool:
    """Whether the user chose the gradient synchronisation (--grad-sync, or sync= in --strategy); otherwise the
    framework's applies (:meth:`~distsim.core.framework.Framework.synchronised`)."""
    return given_options.grad_sync is not None or "sync" in (job.strategy_text or "").lower()


def _megatron(job: TargetOptions, source: JobSourceOptions) -> tuple[Any, TargetOptions]:
    """The --megatron-args job (None without it), and the job naming its model (which --model must not)."""
    if source.megatron_args is None:
        return None, job
    if job.model_name or job.strategy_text or job.plan_path:
        raise click.UsageError("--megatron-args states the model and the strategy: drop --model, --strategy and --plan")
    megatron = read_megatron(source.megatron_args)
    return megatron, replace(job, model_name=megatron.spec, strategy_text="megatron-args")


def _target(plan: Any, job: TargetOptions, model: Any, given_options: StrategyOptions, megatron: Any = None,
            gpus: int = 0) -> Any:  # fmt: skip
    """What is simulated: the plan, or --strategy (or the --megatron-args launch line's) with the strategy options
    (which a plan refuses)."""
    from distsim.core.strategy import Strategy

    overrides, given = strategy_overrides(given_options)
    if megatron is not None:
        return megatron_strategy(megatron, gpus, overrides)
    if model.micro_batch_size is not None and plan is None:
        overrides.setdefault("micro_batch_size", model.micro_batch_size)  # the profiled example batch
    if plan is not None and given:
        raise DistsimError(f"{given[0]} does not apply to --plan; edit the plan file")
    return plan if plan is not None else Strategy.from_str(job.strategy_text, **overrides)


def _run(model: Any, cluster: Any, target: Any, costs: Any, options: Any, simulation: SimulationOptions,
         plan_path: str | None) -> Any:  # fmt: skip
    """Simulate (refusing one above --max-tasks, announcing a long one); a plan's errors name its file."""
    from distsim.plans.simulate import simulate as run_simulation

    samples, max_tasks = simulation.samples, simulation.max_tasks
    try:
        size = estimate_size(model, cluster, target, costs, options, samples)
        progress = _announce(size, max_tasks)
        return run_simulation(model, cluster, target, costs, options, samples=samples, seed=simulation.seed,
                              max_tasks=max_tasks, progress=progress, estimate=size)  # fmt: skip
    except DistsimError as exc:
        if plan_path is None:
            raise
        raise type(exc)(f"{plan_path}: {exc}") from None


def _report(result: Any, job: TargetOptions, costs_given: CostOptions, costs: Any, collocated: Any,
            outputs: OutputOptions, stdout_taken: str | None) -> None:  # fmt: skip
    """The JSON object (--json), or the summary: on stderr when an output took standard output."""
    from distsim.sim.costs import ProfileCosts, framework_of

    provenance = costs.db.provenance if isinstance(costs, ProfileCosts) else None
    framework = framework_of(costs)
    if outputs.as_json:
        data = result.to_dict()
        data["framework"] = framework.name
        if collocated is not None:
            data["collocation"] = collocated.to_dict()
        if provenance is not None:
            data["profile"] = {"path": costs_given.profile_path, "provenance": provenance}
            mismatch = device_mismatch(provenance, result.cluster.gpu.name, result.cluster.gpu.sm_count > 0)
            if mismatch:
                data["profile"]["warning"] = mismatch
        click.echo(json.dumps(data, indent=2))
        return
    report = bool(stdout_taken)  # an output on stdout: the summary goes to stderr
    click.echo(_summary(result, framework), err=report)
    if provenance is not None:
        what = ", ".join(f"{k} {provenance[k]}" for k in ("device", "backend", "torch", "date") if k in provenance)
        also = " (also the model's layer graph)" if costs_given.profile_path == job.model_name else ""
        click.echo(f"profile: {costs_given.profile_path}{also} ({what or 'no provenance recorded'})", err=report)
        mismatch = device_mismatch(provenance, result.cluster.gpu.name, result.cluster.gpu.sm_count > 0)
        if mismatch:
            click.echo(f"warning: {mismatch}", err=True)
        click.echo(_load_note(provenance), nl=False, err=report)
    if collocated is not None:
        click.echo("\n" + format_report(collocated), err=report)
    if outputs.show_schedule:
        from distsim.core.schedules import format_grid

        grid = format_grid(result.flow.schedule)
        click.echo("\nschedule (unit time, F and B one step each):\n" + grid, err=report)


PROGRESS_TASKS = 300_000
"""Tasks (x runs) from which a simulation takes seconds (about 10 us per task deterministic, 2.5 us per task and
stochastic run on AMD EPYC): say so on stderr first."""


def _announce(size: tuple[int, int], max_tasks: int) -> Progress | None:
    """Refuse a simulation above the limit; announce a long one, with a progress line per stochastic run."""
    tasks, runs = size
    check_size(tasks, runs, max_tasks)
    if tasks * runs < PROGRESS_TASKS:
        return None
    what = f"{tasks * runs:,} tasks" + (f" ({tasks:,} x {runs:,} stochastic runs)" if runs > 1 else "")
    click.echo(f"simulating about {what}; this takes a while", err=True)
    return Progress(runs, "stochastic runs") if runs > 1 else None


def _write_outputs(result: Any, outputs: OutputOptions) -> None:
    from distsim.io.files import write_figure, write_timeline_csv

    if not (outputs.trace_path or outputs.csv_path or outputs.table_path or outputs.plot_path):
        return
    title = f"{result.model.name} {result.label} on {result.cluster.name}"
    if outputs.trace_path:
        write_trace(outputs.trace_path, result.timeline, title, expand=outputs.all_gpus)
    if outputs.csv_path:
        write_timeline_csv(outputs.csv_path, result.timeline, expand=outputs.all_gpus)
    if outputs.table_path:
        from distsim.io.table import write_table

        write_table(outputs.table_path, result.timeline, expand=outputs.all_gpus)
    if outputs.plot_path:
        from distsim.io.plots import gantt

        ax = gantt(result.timeline, title=f"{title}: {fmt_time(result.iteration_time_s)} per iteration")
        write_figure(outputs.plot_path, ax.figure)


def _write_rank_traces(result: Any, options: RankTraceOptions) -> None:
    """--trace-dir: one file per GPU of the iteration, in --trace-format."""
    if not options.trace_dir or not options.trace_format:
        return
    from distsim.io.rank_traces import write_rank_traces

    paths = write_rank_traces(options.trace_format, options.trace_dir, result=result)
    click.echo(f"wrote {len(paths)} {options.trace_format} rank traces to {options.trace_dir}", err=True)


def _load_note(provenance: dict[str, Any]) -> str:
    """A line when the profile recorded that the machine was loaded while it was measured ('' if not)."""
    from distsim.infra.machine_load import recorded_warnings
    from distsim.infra.self_check import bias_warning

    found = recorded_warnings(provenance)
    bias = bias_warning(provenance)
    note = f"warning: {bias}\n" if bias else ""
    if not found:
        return note
    more = f" (and {len(found) - 1} more: distsim profile show)" if len(found) > 1 else ""
    return f"the profile was measured under load, its timings may be off: {found[0]}{more}\n" + note


def _summary(r: Any, framework: Any = None) -> str:
    s, m, c = r.strategy, r.model, r.cluster
    if r.plan is not None:
        what = f"plan {r.plan.notation()} ({PLAN_KINDS[r.plan.kind].summary(r.plan)})"
    else:
        what = f"strategy {s} ({s.describe()})"
    lines = [
        f"{m.name} on {c.name} ({c.describe()})",
        f"{what}, global batch {r.global_batch_size}",
        "",
        f"  iteration time     {fmt_time(r.iteration_time_s)}",
    ]
    if r.sampled_iteration_s:
        import numpy as np

        p10, p90 = np.percentile(r.sampled_iteration_s, [10, 90])
        lines[-1] += (f" (median of {len(r.sampled_iteration_s)} stochastic runs; p10 {fmt_time(p10)}, "
                      f"p90 {fmt_time(p90)})")  # fmt: skip
    tput = f"{r.throughput_samples_per_s:,.1f} samples/s"
    if r.throughput_tokens_per_s is not None:
        tput += f", {r.throughput_tokens_per_s:,.0f} tokens/s"
    lines.append(f"  throughput         {tput}")
    lines.append(f"  bubble fraction    {100 * r.bubble_fraction:.1f} % (mean idle share of the iteration)")
    lines.append(f"  exposed comm       {fmt_time(r.exposed_comm_s)} per GPU (mean)")
    worst = max(r.memory, key=lambda x: x.total_bytes)
    kind = PLAN_KINDS[r.plan.kind] if r.plan is not None else None
    burst = kind is not None and kind.memory_per_gpu
    verdict = "fits" if r.fits_in_memory else "OUT OF MEMORY"
    lines.append(
        f"  peak memory        {worst.total_bytes / GB:.2f} GB of {c.gpu.memory_bytes / GB:.0f} GB "
        f"on {'GPU' if burst else 'rank'} {worst.rank} ({verdict}; states {worst.states_bytes / GB:.2f} GB, "
        f"activations {worst.all_activations_bytes / GB:.2f} GB for "
        + ("its shards of the batch)" if burst else f"{worst.in_flight_microbatches:g} micro-batches)")
    )
    lines.append(f"  memory parts       {worst.describe_parts(GB)}")
    sim = len(r.flow.represents)
    mode = "symmetric" if r.flow.symmetric else "full"
    lines.append(
        f"  events             {r.events_total:,} across {r.num_gpus} GPUs, {r.events_unique} unique "
        f"({len(r.flow):,} tasks simulated on {sim} GPU{'s' if sim > 1 else ''}, {mode})"
    )
    counts = r.source_counts()
    lines.append(
        "  event costs        "
        + ", ".join(f"{n} {src}" for src, n in sorted(counts.items()))
        + ("" if r.cost_source == "profile" else " (no --profile: analytic estimates)")
    )
    gpu = c.gpu
    if framework is not None and (gpu.kernel_launch_s > 0 or gpu.sm_count > 0):  # a framework's costs apply
        lines.append(f"  framework          {framework.describe()} (--framework)")
    if "analytic" in counts and r.cost_source == "profile":
        missing = [k for k, c in zip(r.flow.keys, r.flow.key_costs, strict=True) if c.source == "analytic"]
        lines.append(f"  note               {len(missing)} events were not in the profile and were estimated "
                     "analytically (--strict refuses):")  # fmt: skip
        lines += [f"                       {k}" for k in missing[:6]]
        if len(missing) > 6:
            lines.append(f"                       ... and {len(missing) - 6} more (--json lists all)")
    layout = kind.layout_line(r.plan) if kind is not None else None
    if layout is not None:
        lines.append(f"  {layout[0]:<19}{layout[1]}")
    else:
        lines.append("  layers per stage   " + ":".join(str(e - b) for b, e in r.flow.stage_ranges))
    lines.append("")
    lines.append("  per GPU                compute    exposed comm   idle")
    rows: list[tuple[list[int], int, str]] = []  # consecutive simulated GPUs with equal figures share a row
    for rep, targets in sorted(r.flow.represents.items()):  # the timeline's, without building its rows
        g = r.per_gpu.of_gpu(rep)
        figures = f"{fmt_time(g.compute_s):>10} {fmt_time(g.exposed_comm_s):>14} {fmt_time(g.idle_s):>10}"
        if rows and rows[-1][2] == figures and rows[-1][0][-1] == rep - 1 and len(targets) == 1 == rows[-1][1]:
            rows[-1][0].append(rep)
        else:
            rows.append(([rep], len(targets), figures))
    for gpus, alike, figures in rows:
        who = f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {gpus[0]}-{gpus[-1]}"
        if alike > 1:
            who += f" (+{alike - 1} alike)"
        lines.append(f"  {who:<22} {figures}")
    lines.append(f"\nsimulated in {r.wall_time_s:.3f} s")
    return "\n".join(lines)
