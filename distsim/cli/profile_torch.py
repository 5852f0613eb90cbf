"""``distsim profile --torch-model module:function``: the layers of the user's own torch module, discovered and timed.

Rank 0 (a single process, or rank 0 of torchrun or of ``--emulate-nodes``) imports the module, finds its layer graph
and times one layer of each kind; with ``--cluster`` and ``--strategy`` every rank then measures the
communication and optimizer events of those strategies as ``distsim profile --model`` does. The profile gets the layer
graph (``"model"``), so ``distsim simulate --model OUT`` predicts the module from it. The example batch is one
micro-batch: strategies use its size, and another ``--micro-batch-size`` is refused.
"""

from __future__ import annotations

import os
from typing import Any

import click

from distsim.cli.common import invoked_command, need_torch, parse_bytes, portable, strategy_overrides
from distsim.core.errors import DistsimError
from distsim.io.output import check_output


def portable_spec(spec: str) -> str:
    """``file.py:function`` with the file's absolute path (rank processes may start elsewhere); a module as it is."""
    where, sep, name = spec.rpartition(":")
    return f"{portable(where)}{sep}{name}" if sep and os.path.exists(where) else spec


def profile_torch_model(kw: dict[str, Any]) -> None:
    from distsim.core.models import model_from_dict
    from distsim.core.strategy import Strategy
    from distsim.infra.launch import Emulation
    from distsim.io.files import load_cluster, load_profile
    from distsim.profiler.worker import CONFIG_ENV, ProfileConfig

    if kw["model_name"]:
        raise click.UsageError("give --model or --torch-model, not both")
    if kw["grid_gpus"]:
        raise DistsimError("--grid-gpus enumerates micro-batch sizes; a --torch-model has one (its example batch): "
                           "give --strategy instead")  # fmt: skip
    if kw["strategies"] and not kw["cluster_name"]:
        raise click.UsageError("--strategy needs --cluster (the strategies' communication depends on it)")
    if kw["dry_run"]:
        raise DistsimError("--dry-run reports a zoo model's events; --torch-model runs the module to find its own")
    out = kw["out"]
    check_output(out, "--out", stream_ok=False)
    torch = need_torch("profile")
    emulation = (
        Emulation(kw["emulate_nodes"], kw["procs_per_node"], kw["link_bandwidth"]) if kw["emulate_nodes"] else None
    )
    if kw["link_bandwidth"] and emulation is None:
        raise DistsimError("--link-bandwidth shapes emulated nodes: add --emulate-nodes 2")
    existing = None
    if os.path.exists(out) and not kw["overwrite"]:
        from distsim.profiler.worker import check_extension

        existing = load_profile(out)  # a malformed one is refused before anything is measured
        check_extension(existing, out, emulation, kw["no_comm"])
        click.echo(f"extending {out} ({len(existing.compute)} compute events; --overwrite replaces it)", err=True)
    cluster = load_cluster(kw["cluster_name"]) if kw["cluster_name"] else None
    if cluster is not None and kw["nodes"]:
        cluster = cluster.with_nodes(kw["nodes"])
    rank = int(os.environ.get("RANK", 0))
    traced = None
    overrides, _ = strategy_overrides(kw)
    mbs = kw["micro_batch_size"] or 1
    if rank == 0:
        from distsim.profiler.torch_model import trace

        device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        traced = trace(kw["torch_model"], device)
        click.echo(traced.report(), err=True)
        if kw["micro_batch_size"] and kw["micro_batch_size"] != traced.micro_batch_size:
            raise DistsimError(
                f"--micro-batch-size {kw['micro_batch_size']}: the example batch of {kw['torch_model']} holds "
                f"{traced.micro_batch_size} samples and is the micro-batch; return a batch of "
                f"{kw['micro_batch_size']} to profile that size"
            )
        mbs = traced.micro_batch_size
    strategies = [Strategy.from_str(s, **{**overrides, "micro_batch_size": mbs}) for s in kw["strategies"]]
    if strategies and traced is not None and cluster is not None:
        from distsim.search.discovery import discover
        from distsim.sim.costs import AnalyticCosts

        model = model_from_dict(traced.model_dict(), where=kw["torch_model"])
        click.echo(discover(model, cluster, strategies, AnalyticCosts(cluster)).report(), err=True)
    cfg = ProfileConfig(
        model="", cluster=portable(kw["cluster_name"]) if kw["cluster_name"] else "",
        nodes=cluster.nodes if cluster is not None else None, strategies=[st.describe() for st in strategies],
        out=os.path.abspath(out), warmup=kw["warmup"], repeats=kw["repeats"], comm_repeats=kw["comm_repeats"],
        max_comm_bytes=parse_bytes(kw["max_comm_bytes"]), max_group=kw["max_group"], timeout_s=kw["timeout"],
        overwrite=kw["overwrite"], compute=not kw["no_compute"], comm=not kw["no_comm"],
        emulation=emulation.to_dict() if emulation else {}, command=invoked_command(),
        torch_model=portable_spec(kw["torch_model"]),
    )  # fmt: skip
    from distsim.profiler import worker

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun: this process is one rank
        worker.run(cfg, traced)
        if rank != 0:
            return
    elif emulation is None:
        worker.run(cfg, traced)  # one process: compute events only
    else:
        from distsim.infra.launch import launch

        del traced  # rank 0's process traces it again on its own device
        launch("distsim.profiler.worker", {CONFIG_ENV: cfg.to_json()}, emulation, kw["timeout"], what="profiling")
    db = load_profile(out)
    run = (db.provenance.get("runs") or [{}])[-1]
    example = str(strategies[0]) if strategies else "1M1P1D"
    click.echo(
        f"profiling cost: {run.get('compute_events', 0)} compute/optimizer events and "
        f"{run.get('comm_measurements', 0)} communication sizes in {run.get('seconds', 0):.0f} s\n"
        f"predict it: distsim simulate --model {out} --cluster {kw['cluster_name'] or 'CLUSTER'} "
        f"--strategy {example}" + ("" if cluster is not None else " (communication from the cluster's figures)"),
        err=True,
    )
