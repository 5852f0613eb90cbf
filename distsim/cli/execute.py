"""``distsim execute``: run a strategy for real with torch.distributed and record its per-GPU timeline."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import click

from distsim.cli.app import cli
from distsim.cli.common import (
    TIMEOUT_MAX_S,
    FiniteFloatRange,
    RegistryChoice,
    grad_sync_options,
    invoked_command,
    load_costs_for,
    load_model_and_cluster,
    load_plan_for,
    need_torch,
    portable,
    scale_options,
    strategy_overrides,
)
from distsim.cli.megatron_job import global_batch_option, with_global_batch
from distsim.cli.options import ExecuteArgs, StrategyOptions, TargetOptions, rank_trace_options
from distsim.core.errors import DistsimError
from distsim.core.schedules import SCHEDULES
from distsim.io.output import check_output


@cli.command()
@click.option("--model", "-m", "model_name", metavar="NAME|FILE",
              help="Zoo model spec or model file. [default with --plan: the plan's]")  # fmt: skip
@click.option("--cluster", "-c", "cluster_name", metavar="NAME|FILE",
              help="The cluster (cpu-1x2, cpu-2x1 on this machine). [default with --plan: the plan's]")  # fmt: skip
@click.option("--nodes", type=click.IntRange(min=1), help="Override the cluster's node count.")
@click.option("--strategy", "-s", "strategy_text", metavar="xMyPzD", help="As for `distsim simulate`.")
@click.option("--plan", "plan_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="A plan file instead of --strategy: uniform (as `distsim search merge` writes) or burst (as "
              "`distsim search deeppool` writes; ranks 0..N-1 are its GPUs).")  # fmt: skip
@click.option("--micro-batches", type=click.IntRange(min=1), help="M. [default: 1]")
@click.option("--micro-batch-size", type=click.IntRange(min=1), help="[default: 1]")
@click.option("--schedule", type=RegistryChoice(SCHEDULES), help="[default: 1f1b]")
@click.option("--virtual-stages", type=click.IntRange(min=2), help="Chunks per rank (interleaved).")
@click.option("--policy", type=click.Choice(["A", "B"], case_sensitive=False), help="DAPPLE warm-up policy.")
@global_batch_option
@grad_sync_options()
@scale_options
@click.option("--partition", metavar="N:N:...", help="Layers per stage. [default: the simulator's balanced partition]")
@click.option("--profile", "profile_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Balance the partition with these measured costs (as simulate --profile would).")  # fmt: skip
@click.option("--p2p", "p2p_mode", type=click.Choice(["nonblocking", "blocking"]), default="nonblocking",
              show_default=True, help="isend, or a blocking send on the compute stream.")  # fmt: skip
@click.option("--iterations", type=click.IntRange(min=1), default=5, show_default=True, help="Measured iterations.")
@click.option(
    "--warmup", type=click.IntRange(min=0), default=2, show_default=True, help="Iterations run first, unrecorded."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the weights and the synthetic data.")
@click.option("--out", "-o", default="trace.json", show_default=True, type=click.Path(dir_okay=False),
              help="Trace to write (with a Chrome trace of the median iteration, *.chrome.json).")  # fmt: skip
@click.option("--table", "table_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the median measured iteration's timeline as a table in the format its name gives: "
              "*.parquet (dtypes kept, categoricals included; needs pyarrow), *.csv or *.csv.gz (as simulate's "
              "--table).")  # fmt: skip
@rank_trace_options("the median measured iteration, after the run", measured=True)
@click.option("--torch-profiler", is_flag=True,
              help="Each rank also records torch.profiler's (Kineto's) own trace of its measured iterations, to "
              "<out stem>.torch/rank<r>.json: load that directory and --trace-dir's in HTA side by side. The "
              "profiler's overhead is in the measured times.")  # fmt: skip
@click.option("--emulate-nodes", type=click.IntRange(min=1), help="Launch all ranks on this machine as N nodes.")
@click.option("--procs-per-node", type=click.IntRange(min=1), default=1, show_default=True, help="Ranks per node.")
@click.option("--link-bandwidth", metavar="RATE", help="As root: shape the link between 2 emulated nodes (1gbit).")
@click.option("--timeout", type=FiniteFloatRange(min=1, max=TIMEOUT_MAX_S), default=900, show_default=True,
              help="Seconds before a hung run is stopped.")  # fmt: skip
@click.option("--check", type=click.Path(dir_okay=False), hidden=True, help="Write iteration 0's loss and gradients.")
@click.option("--force", is_flag=True, help="Run even when the simulator says the plan does not fit in memory.")
@click.option("--elastic", is_flag=True, help="EasyScale: --max-workers ESTs time-sliced on the ranks launched.")
@click.option("--max-workers", type=click.IntRange(min=1), metavar="P", help="ESTs (logical workers) of --elastic.")
@click.option("--steps", type=click.IntRange(min=0), default=1, show_default=True, help="Global steps of --elastic.")
@click.option("--checkpoint-out", type=click.Path(dir_okay=False), help="--elastic: checkpoint after the steps.")
@click.option("--resume", type=click.Path(dir_okay=False), help="--elastic: resume this checkpoint (any rank count).")
@click.option("--mask-tokens", type=FiniteFloatRange(0, 1, max_open=True), metavar="FRACTION",
              help="--elastic: mask this fraction of input tokens, drawn from each EST's RNG stream.")  # fmt: skip
@click.option("--params-out", type=click.Path(dir_okay=False), hidden=True, help="--elastic: final parameters.")
@click.option("--naive-allreduce", is_flag=True, hidden=True, help="--elastic: gloo all-reduce (not D1).")
def execute(**kw: Any) -> None:
    """Run a plan for real with torch.distributed and record its per-GPU timeline.

    \b
    Two emulated nodes on this machine, pipeline 1F1B with 4 micro-batches:
      distsim execute --model gpt2-cpu --cluster cpu-2x1 --strategy 1M2P1D --schedule 1f1b --micro-batches 4 \\
          --profile profiles/cpu-gloo.json --emulate-nodes 2 --procs-per-node 1 --link-bandwidth 1gbit \\
          --out traces/gpt2.json
    On real nodes run it under torchrun (as `distsim profile`). Then: distsim validate --trace traces/gpt2.json

    \b
    Per-rank Kineto traces for Holistic Trace Analysis (HTA) or Perfetto, with torch.profiler's own beside them:
      distsim execute ... --out run.json --trace-dir run.kineto --trace-format kineto --torch-profiler
      python -c "from hta.trace_analysis import TraceAnalysis as T; \\
          print(T(trace_dir='run.kineto').get_temporal_breakdown(visualize=False))"   # run.torch: the real trace

    \b
    Elastic (EasyScale's ESTs; bit-identical parameters on 1, 2 or 4 ranks, and across a resume):
      distsim execute --elastic --max-workers 4 --model bert-cpu --steps 3 --emulate-nodes 1 --procs-per-node 2
    """
    args = ExecuteArgs.from_params(**kw)
    refuse_unused_options(args)
    if args.run.elastic:
        from distsim.cli.execute_elastic import run_elastic

        run_elastic(args)
        return
    from distsim.executor.worker import CONFIG_ENV

    check_output(args.run.out, "--out", stream_ok=False)
    if args.run.table_path:
        from distsim.io.table import check_table

        check_table(args.run.table_path)
    args.rank_traces.check(measured=True)
    burst, job = _plan_or_strategy(args.job, args.strategy)
    model, cluster = load_model_and_cluster(job)
    if any(b.op.startswith("torch:") for layer in model.layers for b in layer.blocks):
        raise DistsimError(f"{job.model_name} is the layer graph of your own torch module; distsim execute runs "
                           "distsim's blocks, so time the module's own training loop instead "
                           "(benchmarks/torch_model_step.py does, in one process)")  # fmt: skip
    strategy, planned = _checked_strategy(args, job, model, cluster, burst)
    need_torch("execute")
    emulation = args.launch.emulation()
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if args.costs.profile_path and os.environ.get("RANK", "0") == "0":  # before running: the run is still worth having
        warning = _profile_device_check(job, args.costs.profile_path, burst or planned, emulation, torchrun)
        if warning:
            click.echo(f"warning: {warning}", err=True)
    _check_ranks(burst, strategy, emulation, torchrun)
    cfg = _config(args, job, cluster, strategy, burst, emulation)
    b = burst.strategy if burst else None
    what = f"{burst.notation()} (batch {b.micro_batch_size}, {b.grad_sync})" if burst and b else strategy.describe()
    click.echo(f"executing {model.name} {what} on {cluster.name}", err=True)
    from distsim.executor import worker

    if torchrun or emulation is None:
        worker.run(cfg)
    else:
        from distsim.infra.launch import launch

        launch("distsim.executor.worker", {CONFIG_ENV: cfg.to_json()}, emulation, args.launch.timeout,
               what="execution")  # fmt: skip


def _plan_or_strategy(job: TargetOptions, given_options: StrategyOptions) -> tuple[Any, TargetOptions]:
    """The burst plan of --plan (None for --strategy or a uniform plan), and the job with the plan's strategy, model,
    cluster and nodes."""
    burst = None
    if job.plan_path:
        plan, job = load_plan_for(job)
        if plan.kind == "stages":
            raise DistsimError(f"{job.plan_path} is a {plan.kind} plan ({plan.notation()}); distsim execute "
                               "runs uniform strategies (tp x pp x dp) and burst plans")  # fmt: skip
        burst = plan if plan.kind == "burst" else None
        job = replace(job, strategy_text=plan.strategy.describe())  # a burst plan's: one stage, one batch
        given = strategy_overrides(given_options)[1]
        if given:
            raise DistsimError(f"{given[0]} does not apply to --plan; edit the plan file")
    elif not job.strategy_text:
        raise click.UsageError("give --strategy (e.g. 1M2P1D) or --plan FILE")
    if not job.model_name or not job.cluster_name:
        raise click.UsageError("give --model and --cluster (or a --plan that names them)")
    return burst, job


def _checked_strategy(args: ExecuteArgs, job: TargetOptions, model: Any, cluster: Any, burst: Any) -> tuple[Any, Any]:
    """The strategy to run (its partition resolved with the costs, a planned gradient sync's merge plan) once the
    executor supports it and it fits in memory (or --force); and the strategy as given."""
    from distsim.core.strategy import Strategy, check_strategy
    from distsim.executor.support import refuse_unsupported
    from distsim.sim.flow.events import resolve_partition

    overrides, given = strategy_overrides(args.strategy)
    strategy = with_global_batch(Strategy.from_str(job.strategy_text, **overrides), args.strategy.global_batch, given)
    if burst is None:  # a burst plan's one-stage view runs on many GPUs: check_plan checks it below
        check_strategy(strategy, model, cluster)
    planned = strategy  # as given: a new profile may balance another partition
    costs = load_costs_for(args.costs, cluster)
    ranges = resolve_partition(model, strategy, costs)
    if strategy.partition is None:
        strategy = strategy.with_(partition=tuple(e - s for s, e in ranges))
    refuse_unsupported(model, strategy, ranges)  # recompute none|full, optimizer sharding none|zero1
    if burst is not None:
        from distsim.executor.support import refuse_unsupported_burst

        burst.check(model.num_layers, cluster.num_gpus)
        refuse_unsupported_burst(model, burst)
    strategy = _with_merge_plan(model, cluster, strategy, costs)
    _refuse_out_of_memory(model, cluster, burst or strategy, ranges, args.run.force)
    return strategy, planned


def _check_ranks(burst: Any, strategy: Any, emulation: Any, torchrun: bool) -> None:
    """Refuse a launch of another number of ranks than the plan's GPUs."""
    ranks = emulation.world if emulation else (int(os.environ["WORLD_SIZE"]) if torchrun else 1)
    needed = burst.num_gpus if burst else strategy.num_gpus
    if ranks != needed:
        raise DistsimError(f"{burst.notation() if burst else strategy} needs {needed} ranks but this launch starts "
                           f"{ranks} (--emulate-nodes x --procs-per-node, or torchrun's world size)")  # fmt: skip


def _config(args: ExecuteArgs, job: TargetOptions, cluster: Any, strategy: Any, burst: Any, emulation: Any) -> Any:
    """The ranks' configuration (:class:`~distsim.executor.worker.ExecuteConfig`)."""
    from distsim.executor.worker import ExecuteConfig

    run, out, profile_path = args.run, args.run.out, args.costs.profile_path
    return ExecuteConfig(
        model=portable(job.model_name), cluster=portable(job.cluster_name), nodes=cluster.nodes,
        strategy=strategy.describe(), out=os.path.abspath(out), p2p_blocking=run.p2p_mode == "blocking",
        iterations=run.iterations, warmup=run.warmup, seed=run.seed,
        check=os.path.abspath(run.check) if run.check else None, timeout_s=args.launch.timeout,
        profile=os.path.relpath(os.path.abspath(profile_path), os.path.dirname(os.path.abspath(out)))
        if profile_path else None,  # relative to the trace, so that traces and profiles move together
        emulation=emulation.to_dict() if emulation else {},
        command=invoked_command(),
        burst=_burst_form(burst, job) if burst else None,
        trace_dir=os.path.abspath(args.rank_traces.trace_dir) if args.rank_traces.trace_dir else None,
        torch_profiler=run.torch_profiler,
        table=os.path.abspath(run.table_path) if run.table_path else None,
    )  # fmt: skip


PLAN, ELASTIC, BOTH = "plan", "elastic", "both"
USED_BY: dict[str, str] = {
    "model_name": BOTH, "cluster_name": PLAN, "nodes": PLAN, "strategy_text": PLAN, "plan_path": PLAN,
    "micro_batches": PLAN, "global_batch": PLAN, "micro_batch_size": BOTH, "schedule": PLAN, "virtual_stages": PLAN,
    "policy": PLAN,
    "grad_sync": PLAN, "bucket_cap_mb": PLAN, "recompute": PLAN, "recompute_layers": PLAN, "sequence_parallel": PLAN,
    "optimizer_sharding": PLAN, "partition": PLAN, "profile_path": PLAN, "p2p_mode": PLAN, "iterations": PLAN,
    "warmup": PLAN, "seed": BOTH, "out": PLAN, "emulate_nodes": BOTH, "procs_per_node": BOTH, "link_bandwidth": PLAN,
    "timeout": BOTH, "check": PLAN, "force": PLAN, "elastic": BOTH, "max_workers": ELASTIC, "steps": ELASTIC,
    "checkpoint_out": ELASTIC, "resume": ELASTIC, "mask_tokens": ELASTIC, "params_out": ELASTIC,
    "naive_allreduce": ELASTIC, "trace_dir": PLAN, "trace_format": PLAN, "torch_profiler": PLAN,
    "table_path": PLAN,
}  # fmt: skip
"""Which runs use each option of ``distsim execute``: a plan's (a strategy or a plan file, traced), an elastic one's
(--elastic: P ESTs data-parallel, the whole model on each rank, no trace), or both. An option given on the command
line (or from the environment), even with its default value, to a run that does not use it is refused."""


def _flag(param: click.Parameter) -> str:
    return next((o for o in param.opts if o.startswith("--")), param.opts[0])


def refuse_unused_options(args: ExecuteArgs) -> None:
    """One line for the first option given that this kind of run does not use (:data:`USED_BY`), never ignored."""
    from click.core import ParameterSource

    mode = ELASTIC if args.run.elastic else PLAN
    ctx = click.get_current_context(silent=True)
    for param in execute.params:
        if param.name not in args.names() or USED_BY[param.name] in (BOTH, mode):
            continue
        if ctx is None:  # called without click (a test): given is what is set and differs from the default
            value = args.value(param.name)
            given = value not in (None, False) and value != param.default
        else:  # from the command line or the environment, even with the default's value
            given = ctx.get_parameter_source(param.name) not in (None, ParameterSource.DEFAULT,
                                                                 ParameterSource.DEFAULT_MAP)  # fmt: skip
        if not given:
            continue
        if mode == PLAN:
            raise DistsimError(f"{_flag(param)} applies to --elastic runs only")
        takes = ", ".join(_flag(p) for p in execute.params if USED_BY.get(p.name or "") in (BOTH, ELASTIC)
                          and not getattr(p, "hidden", False) and p.name != "elastic")  # fmt: skip
        raise DistsimError(f"{_flag(param)} does not apply to --elastic (P ESTs data-parallel, the whole model on "
                           f"each rank, no trace), which takes {takes}")  # fmt: skip


def _burst_form(plan: Any, job: TargetOptions) -> dict[str, Any]:
    """The burst plan's file form for the ranks and the trace, naming the model and cluster as the run does."""
    from distsim.plans import plan_to_dict

    return {**plan_to_dict(plan), "model": portable(job.model_name), "cluster": portable(job.cluster_name)}


def _with_merge_plan(model: Any, cluster: Any, strategy: Any, costs: Any) -> Any:
    """A planned gradient synchronisation (mgwfbp) with its merge plan resolved from the costs (the profile, else
    analytic) before anything runs: every rank runs the same groups, and the trace's plan records them, so that
    `distsim validate` simulates these groups and not a plan of its own costs."""
    from distsim.core.sync import MODES
    from distsim.sim.flow.uniform import merge_groups

    if not MODES[strategy.grad_sync].planned or strategy.grad_groups:
        return strategy
    groups = merge_groups(model, cluster, strategy, costs)
    click.echo(f"{strategy.grad_sync} merge plan: " + "/".join(f"{lo}-{hi}" for lo, hi in groups), err=True)
    return strategy.with_(grad_groups=groups)


def _refuse_out_of_memory(model: Any, cluster: Any, strategy: Any, ranges: Any, force: bool) -> None:
    """The memory model's verdict before anything runs: a plan (a strategy, or a burst plan) that does not fit is
    refused unless --force."""
    from distsim.core.schedules import build_schedule
    from distsim.plans import Plan
    from distsim.plans.burst import burst_memory
    from distsim.sim.memory import estimate_memory

    where = "pipeline rank"
    if isinstance(strategy, Plan):
        memory = burst_memory(model, strategy.burst, strategy.strategy.micro_batch_size, cluster.gpu.memory_bytes)
        strategy, where = strategy.notation(), "GPU"
    else:
        memory = estimate_memory(model, strategy, build_schedule(strategy), ranges, cluster.gpu.memory_bytes)
    worst = max(memory, key=lambda m: m.total_bytes)
    if worst.fits or force:
        return
    raise DistsimError(
        f"{strategy} does not fit in memory: {where} {worst.rank} needs {worst.total_bytes / 1e9:.2f} GB of the "
        f"{cluster.gpu.memory_bytes / 1e9:.0f} GB of a {cluster.gpu.name} of {cluster.name} (distsim simulate shows "
        "the breakdown); --force runs it anyway"
    )


def device_warning(profile_path: str, profiled_on: str | None, here: str, profile_cmd: str, out: str) -> str | None:
    """Why a profile of another device will not predict a run on this one, and what to do; None if it matches."""
    if not profiled_on or profiled_on == here:
        return None
    return (f"{profile_path} was measured on {profiled_on!r}, this machine is {here!r}: its timings will not predict "
            f"this run, and `distsim validate` will refuse to compare them with the trace. Profile this machine "
            f"first, `{profile_cmd}`, then execute again with --profile {out}")  # fmt: skip


def _profile_device_check(job: TargetOptions, profile_path: str, strategy: Any, emulation: Any,
                          torchrun: bool) -> str | None:  # fmt: skip
    """device_warning for --profile against this machine's device (named as the profiler names it)."""
    from distsim.cli.common import profile_command, profile_out_name
    from distsim.io.files import load_profile
    from distsim.profiler.compute import local_device_name

    profiled_on = load_profile(profile_path).provenance.get("device")
    here = local_device_name()
    if not profiled_on or profiled_on == here:
        return None
    world = int(os.environ["WORLD_SIZE"]) if torchrun else strategy.num_gpus
    run_nodes = world // int(os.environ.get("LOCAL_WORLD_SIZE", world)) if torchrun else 1
    out = profile_out_name(job.model_name, job.cluster_name)
    burst = getattr(strategy, "burst", None)  # a burst plan is profiled from its file
    command = profile_command(job.model_name, job.cluster_name, strategy, out, nodes=job.nodes,
                              emulation=emulation.to_dict() if emulation else None, world=world,
                              run_nodes=run_nodes, plan_path=job.plan_path if burst else None)  # fmt: skip
    return device_warning(profile_path, profiled_on, here, command, out)
