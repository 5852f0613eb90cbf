"""``distsim profile --torch-model module:function``: the layers of the user's own torch module, discovered and timed.

Rank 0 (a single process, or rank 0 of torchrun or of ``--emulate-nodes``) imports the module, finds its layer graph
and times one layer of each kind; with ``--cluster`` and ``--strategy`` every rank then measures the
communication and optimizer events of those strategies as ``distsim profile --model`` does. The profile gets the layer
graph (``"model"``), so ``distsim simulate --model OUT`` predicts the module from it. The example batch is one
micro-batch: strategies use its size, and another ``--micro-batch-size`` is refused.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import click

from distsim.cli.common import invoked_command, need_torch, parse_bytes, portable, strategy_overrides
from distsim.core.errors import DistsimError
from distsim.io.output import check_output

if TYPE_CHECKING:
    from distsim.cli.options import ProfileArgs


def portable_spec(spec: str) -> str:
    """``file.py:function`` with the file's absolute path (rank processes may start elsewhere); a module as it is."""
    where, sep, name = spec.rpartition(":")
    return f"{portable(where)}{sep}{name}" if sep and os.path.exists(where) else spec


def profile_torch_model(args: ProfileArgs) -> None:
    from distsim.core.models import model_from_dict
    from distsim.core.strategy import Strategy
    from distsim.io.files import load_cluster, load_profile

    job, targets, measure = args.job, args.targets, args.measure
    _refuse_options(args)
    out = measure.out
    check_output(out, "--out", stream_ok=False)
    torch = need_torch("profile")
    emulation = args.launch.emulation()
    existing = None
    if os.path.exists(out) and not measure.overwrite:
        from distsim.profiler.worker import check_extension

        existing = load_profile(out)  # a malformed one is refused before anything is measured
        check_extension(existing, out, emulation, measure.no_comm)
        click.echo(f"extending {out} ({len(existing.compute)} compute events; --overwrite replaces it)", err=True)
    cluster = load_cluster(job.cluster_name) if job.cluster_name else None
    if cluster is not None and job.nodes:
        cluster = cluster.with_nodes(job.nodes)
    rank = int(os.environ.get("RANK", 0))
    overrides, _ = strategy_overrides(args.strategy)
    split = [s for s in targets.strategies if Strategy.from_str(s, **overrides).tp > 1]
    if split:  # before anything is traced or timed: its blocks are whole modules
        raise DistsimError(f"--torch-model profiles your module's blocks whole, for tensor parallelism 1: "
                           f"--strategy {split[0]} splits them (tp > 1); use pipeline and data parallelism "
                           "(e.g. 1M2P1D)")  # fmt: skip
    traced = _trace(torch, targets.torch_model, args.strategy.micro_batch_size) if rank == 0 else None
    mbs = traced.micro_batch_size if traced is not None else args.strategy.micro_batch_size or 1
    strategies = [Strategy.from_str(s, **{**overrides, "micro_batch_size": mbs}) for s in targets.strategies]
    if strategies and traced is not None and cluster is not None:
        from distsim.search.discovery import discover
        from distsim.sim.costs import AnalyticCosts

        model = model_from_dict(traced.model_dict(), where=targets.torch_model)
        click.echo(discover(model, cluster, strategies, AnalyticCosts(cluster)).report(), err=True)
    cfg = _config(args, cluster, strategies, emulation)
    from distsim.profiler import worker
    from distsim.profiler.worker import CONFIG_ENV

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun: this process is one rank
        worker.run(cfg, traced)
        if rank != 0:
            return
    elif emulation is None:
        worker.run(cfg, traced)  # one process: compute events only
    else:
        from distsim.infra.launch import launch

        del traced  # rank 0's process traces it again on its own device
        launch("distsim.profiler.worker", {CONFIG_ENV: cfg.to_json()}, emulation, args.launch.timeout,
               what="profiling")  # fmt: skip
    click.echo(_cost_report(load_profile(out), out, job.cluster_name, cluster, strategies), err=True)


def _refuse_options(args: ProfileArgs) -> None:
    """The options --torch-model does not take."""
    if args.job.model_name:
        raise click.UsageError("give --model or --torch-model, not both")
    if args.targets.grid_gpus:
        raise DistsimError("--grid-gpus enumerates micro-batch sizes; a --torch-model has one (its example batch): "
                           "give --strategy instead")  # fmt: skip
    if args.targets.strategies and not args.job.cluster_name:
        raise click.UsageError("--strategy needs --cluster (the strategies' communication depends on it)")
    if args.measure.dry_run:
        raise DistsimError("--dry-run reports a zoo model's events; --torch-model runs the module to find its own")


def _trace(torch: Any, spec: str, micro_batch_size: int | None) -> Any:
    """The module's layer graph, its layers timed (rank 0); its example batch is the micro-batch (--micro-batch-size
    may only repeat its size)."""
    from distsim.profiler.torch_model import trace

    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    traced = trace(spec, device)
    click.echo(traced.report(), err=True)
    if micro_batch_size and micro_batch_size != traced.micro_batch_size:
        raise DistsimError(
            f"--micro-batch-size {micro_batch_size}: the example batch of {spec} holds "
            f"{traced.micro_batch_size} samples and is the micro-batch; return a batch of "
            f"{micro_batch_size} to profile that size"
        )
    return traced


def _config(args: ProfileArgs, cluster: Any, strategies: list[Any], emulation: Any) -> Any:
    """The ranks' configuration (:class:`~distsim.profiler.worker.ProfileConfig`)."""
    from distsim.profiler.worker import ProfileConfig

    job, m = args.job, args.measure
    return ProfileConfig(
        model="", cluster=portable(job.cluster_name) if job.cluster_name else "",
        nodes=cluster.nodes if cluster is not None else None, strategies=[st.describe() for st in strategies],
        out=os.path.abspath(m.out), warmup=m.warmup, repeats=m.repeats, comm_repeats=m.comm_repeats,
        max_comm_bytes=parse_bytes(m.max_comm_bytes), max_group=m.max_group, timeout_s=args.launch.timeout,
        overwrite=m.overwrite, compute=not m.no_compute, comm=not m.no_comm, self_check=not m.no_self_check,
        emulation=emulation.to_dict() if emulation else {}, command=invoked_command(),
        torch_model=portable_spec(args.targets.torch_model),
    )  # fmt: skip


def _cost_report(db: Any, out: str, cluster_name: str | None, cluster: Any, strategies: list[Any]) -> str:
    """What the run measured, and how to predict the module from the profile."""
    run = (db.provenance.get("runs") or [{}])[-1]
    example = str(strategies[0]) if strategies else "1M1P1D"
    return (
        f"profiling cost: {run.get('compute_events', 0)} compute/optimizer events and "
        f"{run.get('comm_measurements', 0)} communication sizes in {run.get('seconds', 0):.0f} s\n"
        f"predict it: distsim simulate --model {out} --cluster {cluster_name or 'CLUSTER'} "
        f"--strategy {example}" + ("" if cluster is not None else " (communication from the cluster's figures)")
    )
