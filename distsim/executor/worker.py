"""One executor rank: the same code under torchrun on real nodes and under `distsim execute --emulate-nodes`.

Every rank builds its part of the plan, trains ``warmup + iterations`` steps on synthetic data and records its events
(on a GPU from CUDA events, mapped onto the host clock per iteration: :mod:`distsim.executor.clock`); rank 0 gathers
them once every rank has finished, aligns the clocks (one machine shares CLOCK_MONOTONIC; ranks on other hosts are
offset by a ping-pong estimate against rank 0), and writes the trace (plus a Chrome trace of the median iteration,
and with ``--table`` that iteration's timeline as a table). Each row carries what the rank recorded of its event
beyond its times (key, bytes, peer, group: :mod:`distsim.executor.keys`). Nothing is written if any rank fails.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from distsim.core.errors import DistsimError
from distsim.infra.launch import WorkerConfig, inject_fault, stop_if_orphaned, worker_main

CONFIG_ENV = "DISTSIM_EXECUTE_CONFIG"


@dataclass
class ExecuteConfig(WorkerConfig):
    model: str
    cluster: str
    nodes: int
    strategy: str
    """Readable strategy with an explicit partition (the simulator's)."""
    out: str
    p2p_blocking: bool = False
    iterations: int = 5
    warmup: int = 2
    seed: int = 0
    lr: float = 1e-4
    profile: str | None = None
    """The profile whose costs balanced the partition; validation predicts with it by default."""
    check: str | None = None
    """Write iteration 0's loss, full gradients (before the optimizer step) and parameters (after it) here, for
    correctness tests."""
    timeout_s: float = 900.0
    emulation: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    burst: dict[str, Any] | None = None
    """A burst plan's file form (:mod:`distsim.plans.burst`), run by :mod:`distsim.executor.burst`; `strategy` is
    then
    its schedule-level view (one stage, one batch)."""
    trace_dir: str | None = None
    """Rank 0 writes the median iteration as one Kineto trace per rank here (:mod:`distsim.io.kineto`)."""
    torch_profiler: bool = False
    """Each rank records torch.profiler's trace of its measured iterations (:func:`_torch_profiler`)."""
    table: str | None = None
    """Rank 0 writes the median iteration's timeline here as a table (:func:`distsim.io.table.write_table`)."""


def _log(message: str) -> None:
    print(f"[distsim execute] {message}", file=sys.stderr, flush=True)


def run(cfg: ExecuteConfig) -> None:
    """Execute as one rank of the job described by the environment: load and check the plan (:func:`_load_plan`),
    build this rank's part of it (:func:`_plan_runtime`, :func:`_burst_runtime`), train ``warmup + iterations``
    steps (:func:`_train`), and once every rank has finished, rank 0 writes the trace (:func:`_write_trace`)."""
    import torch.distributed as dist

    from distsim.profiler.blocks import torch_dtype
    from distsim.profiler.worker import init_rank

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    model, cluster, strategy, burst = _load_plan(cfg, world)
    device = init_rank(local_rank, local_world, world, cfg.timeout_s)
    barrier = dist.barrier if world > 1 else (lambda: None)
    dtype = torch_dtype(model.precision.name, device)
    if burst is not None:
        runtime, loss_ranks = _burst_runtime(cfg, model, burst, rank, world, dtype, device)
    else:
        runtime, loss_ranks = _plan_runtime(cfg, model, cluster, strategy, rank, world, dtype, device)
    offsets = _clock_offsets(rank, world, device) if world > 1 else {0: 0.0}
    _train(cfg, runtime, strategy, rank, world, barrier)
    payload = (rank, runtime.recorder, runtime.losses)
    gathered: list[Any] = [payload]
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, payload)
        barrier()
    if rank == 0:
        _write_trace(cfg, model, cluster, strategy, burst, runtime, gathered, offsets, loss_ranks, world, device)
    if world > 1:
        dist.destroy_process_group()


def _load_plan(cfg: ExecuteConfig, world: int) -> tuple[Any, Any, Any, Any]:
    """(model, cluster, strategy, burst plan or None), checked to run on this job's `world` ranks."""
    from distsim.core.strategy import Strategy, check_strategy
    from distsim.io.files import load_cluster, load_model
    from distsim.plans import plan_from_dict

    model = load_model(cfg.model)
    cluster = load_cluster(cfg.cluster).with_nodes(cfg.nodes)
    strategy = Strategy.from_str(cfg.strategy)
    burst = plan_from_dict(cfg.burst, "the burst plan") if cfg.burst else None
    if burst is None:
        check_strategy(strategy, model, cluster)
    if strategy.partition is None and burst is None:
        raise DistsimError("the executor needs the strategy's partition (the simulator's)")
    ranks = burst.num_gpus if burst else strategy.num_gpus
    if world != ranks:
        raise DistsimError(f"{burst.notation() if burst else strategy} needs {ranks} ranks, this job has {world}")
    return model, cluster, strategy, burst


def _burst_runtime(cfg: ExecuteConfig, model: Any, burst: Any, rank: int, world: int, dtype: Any,
                   device: Any) -> tuple[Any, set[int]]:  # fmt: skip
    """This rank's :class:`~distsim.executor.burst.BurstRuntime` and the ranks whose losses make the batch's."""
    from distsim.executor.burst import BurstRuntime, burst_groups

    groups = burst_groups(model, burst, rank) if world > 1 else {}
    runtime = BurstRuntime(model, burst, rank, groups, dtype, device, cfg.seed, cfg.lr)
    return runtime, set(burst.burst[-1])  # their weighted shard losses add up to the batch's


def _plan_runtime(cfg: ExecuteConfig, model: Any, cluster: Any, strategy: Any, rank: int, world: int, dtype: Any,
                  device: Any) -> tuple[Any, set[int]]:  # fmt: skip
    """This rank's :class:`~distsim.executor.runtime.Runtime` of the strategy (its process groups, tied layers'
    parameter) and the ranks whose losses are the last stage's."""
    from distsim.core.partition import ranges
    from distsim.core.placement import Placement
    from distsim.core.schedules import build_schedule
    from distsim.executor.runtime import Runtime

    placement = Placement(strategy, cluster)
    schedule = build_schedule(strategy)
    stage_ranges = ranges(strategy.partition)
    groups = _groups(model, strategy, placement, stage_ranges, rank) if world > 1 else {}
    runtime = Runtime(model, strategy, placement, schedule, stage_ranges, rank, groups, dtype, device, cfg.seed,
                      cfg.p2p_blocking, cfg.lr)  # fmt: skip
    if "tied_layers" in groups:
        runtime.groups["tied_param"] = _tied_param(runtime, groups["tied_layers"])
    if strategy.dp > 1 and runtime.grad_units() != runtime.simulated_units():  # a model file without tensors
        _log(f"warning: rank {rank}'s parameter tensors are not the model's (its blocks' tensors): its gradient "
             f"buckets ({len(runtime.buckets)}) may not be the ones the simulator predicts")  # fmt: skip
    return runtime, {int(g) for g in placement.grid[strategy.pp - 1, 0, :1]}


def _train(cfg: ExecuteConfig, runtime: Any, strategy: Any, rank: int, world: int, barrier: Any) -> None:
    """Run ``warmup + iterations`` training iterations (with ``cfg.check``, capturing iteration 0)."""
    total = cfg.warmup + cfg.iterations
    profiler = _torch_profiler(cfg, runtime, rank) if cfg.torch_profiler else None
    for it in range(total):
        inject_fault(rank, str(it), _log)  # DISTSIM_FAULT=rank=R,at=ITERATION,mode=die|hang
        before, after = _capture(runtime, cfg, strategy, rank, world) if cfg.check and it == 0 else (None, None)
        if profiler is not None and it == cfg.warmup:
            profiler.start()
        runtime.run_iteration(it, barrier, before_step=before, after_step=after)
        runtime.zero_grad()
        if profiler is not None and it >= cfg.warmup:
            profiler.step()  # ends this iteration's ProfilerStep; the last one's ends the schedule and exports
        if rank == 0:
            _log(f"iteration {it + 1}/{total}{' (warm-up)' if it < cfg.warmup else ''}")
    if profiler is not None:
        profiler.stop()


def torch_trace_path(out: str, rank: int) -> str:
    """Where rank `rank` writes torch.profiler's trace: ``<out stem>.torch/rank<r>.json``, a directory of its own
    (HTA reads every JSON file of a directory as some rank's trace, so it must not share distsim's)."""
    return os.path.join(os.path.splitext(out)[0] + ".torch", f"rank{rank}.json")


def _torch_profiler(cfg: ExecuteConfig, runtime: Any, rank: int) -> Any:
    """A torch.profiler (Kineto) over the measured iterations, one ProfilerStep each, exported by every rank to
    :func:`torch_trace_path` once the last one ends. Only with --torch-profiler: its hooks cost host time, which the
    measured times then include; without it the iterations run as before."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if getattr(runtime.device, "type", str(runtime.device)) == "cuda":
        activities.append(ProfilerActivity.CUDA)
    path = torch_trace_path(cfg.out, rank)

    def export(prof: Any) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        prof.export_chrome_trace(path)
        _log(f"rank {rank}: wrote torch.profiler's trace {path}")

    with warnings.catch_warnings():  # "won't be using warmup": distsim's own warm-up iterations ran before it
        warnings.filterwarnings("ignore", message=".*warmup.*", category=UserWarning)
        return profile(activities=activities, schedule=schedule(wait=0, warmup=0, active=cfg.iterations, repeat=1),
                       on_trace_ready=export)  # fmt: skip


def _write_trace(cfg: ExecuteConfig, model: Any, cluster: Any, strategy: Any, burst: Any, runtime: Any,
                 gathered: list[Any], offsets: dict[int, float], loss_ranks: set[int], world: int,
                 device: Any) -> None:  # fmt: skip
    """Rank 0, once every rank has finished: the measured iterations on rank 0's clock (:func:`_assemble`) with their
    losses, written to ``cfg.out`` (unless the launcher abandoned the run) with a Chrome trace of the median
    iteration beside it."""
    from distsim.io.files import write_chrome_trace, write_json
    from distsim.io.trace import Trace

    total = cfg.warmup + cfg.iterations
    iterations = _assemble(gathered, offsets, cfg.warmup, total, cluster.gpus_per_node)
    loss_rows = _loss_rows(gathered, loss_ranks, strategy, burst, cfg.warmup, total)
    provenance = _trace_provenance(cfg, runtime, offsets, world, device)
    if cfg.torch_profiler:  # its hooks' host time is in the measured times
        provenance["torch_profiler"] = os.path.dirname(torch_trace_path(cfg.out, 0))
    plan = {"model": cfg.model, "cluster": cfg.cluster, "nodes": cfg.nodes, "strategy": cfg.strategy,
            "p2p_blocking": cfg.p2p_blocking, "seed": cfg.seed, "iterations": cfg.iterations,
            "warmup": cfg.warmup, "emulation": cfg.emulation, "profile": cfg.profile}  # fmt: skip
    if cfg.burst:
        plan["burst"] = cfg.burst
    trace = Trace(plan, provenance, iterations, loss_rows)
    stop_if_orphaned()  # a launcher killed mid-run abandoned it: no trace
    write_json(cfg.out, trace.to_dict())
    chrome = os.path.splitext(cfg.out)[0] + ".chrome.json"
    median = trace.timeline(trace.median_index(), cluster.gpus_per_node)
    write_chrome_trace(chrome, median, f"measured {model.name} {burst.notation() if burst else strategy}")
    if cfg.table:
        from distsim.io.table import write_table

        write_table(cfg.table, median)
        _log(f"wrote iteration {cfg.warmup + trace.median_index()}'s timeline to {cfg.table}")
    if cfg.trace_dir:
        from distsim.io.rank_traces import write_rank_traces

        stem = os.path.basename(os.path.splitext(cfg.out)[0])
        ranks = write_rank_traces("kineto", cfg.trace_dir, timeline=median, stem=stem,
                                  backend=str(provenance.get("backend", "gloo")),
                                  device_name=str(provenance.get("device", device)),
                                  step=cfg.warmup + trace.median_index())  # fmt: skip
        _log(f"wrote {len(ranks)} Kineto rank traces of iteration {cfg.warmup + trace.median_index()} to "
             f"{cfg.trace_dir}")  # fmt: skip
    times = trace.iteration_times_s
    _log(
        f"wrote {cfg.out} and {chrome}: {len(times)} iterations, median {trace.median_iteration_s * 1e3:.1f} ms "
        f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}, spread {100 * trace.iteration_spread:.1f} %)"
    )
    overhead = provenance["executor"]["overhead_us_per_block"]
    if overhead:
        _log("the executor's own host time per block (its hooks and marks; a training loop has none of it): "
             + ", ".join(f"{k} {v:.1f} us" for k, v in overhead.items()))  # fmt: skip


def _loss_rows(gathered: list[Any], loss_ranks: set[int], strategy: Any, burst: Any, warmup: int,
               total: int) -> list[list[float]]:  # fmt: skip
    """Per measured iteration, its micro-batches' losses (a burst plan: the batch's, the sum of the shards')."""
    losses = [v for r, _rec, v in gathered if r in loss_ranks]
    per_iter = strategy.num_micro_batches
    loss_rows = [losses[0][i * per_iter : (i + 1) * per_iter] for i in range(warmup, total)] if losses else []
    if burst is not None:
        loss_rows = [[sum(part[i] for part in losses)] for i in range(warmup, total)]
    return loss_rows


def _trace_provenance(cfg: ExecuteConfig, runtime: Any, offsets: dict[int, float], world: int,
                      device: Any) -> dict[str, Any]:  # fmt: skip
    """Where and how the trace was measured: device, backend, versions, host, threads, clock offsets and timing."""
    import torch
    import torch.distributed as dist

    from distsim.profiler.compute import device_name

    cuda = device.type == "cuda"
    provenance = {
        "device": device_name(device), "backend": dist.get_backend() if world > 1 else "none",
        "torch": torch.__version__, "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(), "platform": platform.platform(),
        "threads_per_rank": torch.get_num_threads() if not cuda else None, "command": cfg.command,
        "clock_offsets_s": {str(k): v for k, v in offsets.items()}, "timing": runtime.clock.describe(),
        "executor": {
            "loop": "per micro-batch and stage one forward pass through the blocks and one backward call; each "
                    "block's backward timed by autograd hooks inside it (distsim.executor.backward)",
            "overhead_us_per_block": runtime.hooks.overhead.per_block_us(),
        },
    }  # fmt: skip
    if runtime.zero is not None and runtime.zero.gloo:  # its gradient reduce-scatters are all-reduces
        from distsim.profiler.comm import GLOO_NOTES

        provenance["notes"] = {"reduce_scatter": GLOO_NOTES["reduce_scatter"]}
    return provenance


# ------------------------------------------------------------------------------------------------------- groups
def _groups(model: Any, strategy: Any, placement: Any, stage_ranges: Any, rank: int) -> dict[str, Any]:
    """Every rank creates every group in the same order and keeps its own."""
    import torch.distributed as dist

    from distsim.core.partition import rank_layers

    grid = placement.grid
    pp, dp, tp = strategy.pp, strategy.dp, strategy.tp
    out: dict[str, Any] = {}
    for p in range(pp):
        for d in range(dp):
            members = [int(g) for g in grid[p, d, :]]
            group = dist.new_group(members)
            if rank in members:
                out["tp"] = group
    for p in range(pp):
        for t in range(tp):
            members = [int(g) for g in grid[p, :, t]]
            group = dist.new_group(members)
            if rank in members:
                out["dp"] = group
    # one group per direction between pipeline neighbours: on NCCL the sends and receives of one communicator run
    # in order on one stream, so activations one way and gradients the other way (1F1B: rank 0 sends act k+1
    # before it receives grad k, rank 1 sends grad k before it receives act k+1) could wait on each other
    for p in range(pp if pp > 1 else 0):
        q = (p + 1) % pp  # activations go p -> q (q = 0: the next chunk of an interleaved schedule), gradients back
        for phase, (src, dst) in (("F", (p, q)), ("B", (q, p))):
            for d in range(dp):
                for t in range(tp):
                    a, b = int(grid[src, d, t]), int(grid[dst, d, t])
                    group = dist.new_group(sorted({a, b}))
                    if rank in (a, b):
                        out.setdefault("p2p", {})[(a, b, phase)] = group
    rank_of = {li: r for r in range(pp) for li in rank_layers(stage_ranges, pp, r)}
    for li, layer in enumerate(model.layers):
        if layer.tied_to is None:
            continue
        target = model.index[layer.tied_to]
        ra, rb = rank_of[target], rank_of[li]
        if ra == rb:
            continue
        for d in range(dp):
            for t in range(tp):
                members = [int(grid[ra, d, t]), int(grid[rb, d, t])]
                group = dist.new_group(members)
                if rank in members:
                    out["tied"] = group
                    out["tied_layers"] = (li, target, f"tied grads {layer.name}~{layer.tied_to}")
    return out


def _tied_param(runtime: Any, tied: tuple[int, int, str]) -> tuple[int, Any, str]:
    from distsim.executor.model import vocab_weight

    li, target, name = tied
    own = li if (li, 0) in runtime.modules else target
    return li, vocab_weight(runtime.modules[(own, 0)]), name


def _clock_offsets(rank: int, world: int, device: Any) -> dict[int, float]:
    """Seconds to subtract from each rank's clock to read rank 0's: 0 on rank 0's host, else a ping-pong estimate."""
    import torch
    import torch.distributed as dist

    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    offsets = {r: 0.0 for r in range(world)}
    for r in range(1, world):
        if hosts[r] == hosts[0]:
            continue
        best = (float("inf"), 0.0)
        buf = torch.zeros(1, dtype=torch.float64, device=device)  # NCCL sends device tensors only
        for _ in range(10):
            if rank == 0:
                t0 = time.perf_counter()
                dist.send(buf, r)
                dist.recv(buf, r)
                t1 = time.perf_counter()
                best = min(best, (t1 - t0, float(buf.item()) - (t0 + t1) / 2))
            elif rank == r:
                dist.recv(buf, 0)
                buf.fill_(time.perf_counter())
                dist.send(buf, 0)
        shared = [best[1]]
        dist.broadcast_object_list(shared, src=0)
        offsets[r] = float(shared[0])
    return offsets


# ---------------------------------------------------------------------------------------------------- results
def _assemble(gathered: list[Any], offsets: dict[int, float], warmup: int, total: int, gpus_per_node: int) -> list[Any]:
    """Per measured iteration, a DataFrame in the Timeline schema with times from the iteration's start, and what
    each row says beyond them (:data:`distsim.sim.timeline.COMM_COLUMNS`, from the recorders' ``row_info`` and
    ``send_info``; a row without any says nothing)."""
    import pandas as pd

    from distsim.executor.keys import NO_INFO
    from distsim.io.trace import comm_dtypes
    from distsim.sim.timeline import COMM_COLUMNS

    recv_end: dict[tuple[Any, ...], float] = {}
    send_start: dict[tuple[Any, ...], float] = {}
    for rank, rec, _losses in gathered:  # a transfer with several senders or receivers (burst plans) spans them all
        for it, key, end in rec.p2p_recvs:
            recv_end[(it, *key)] = max(recv_end.get((it, *key), -float("inf")), end - offsets[rank])
        for it, key, row in rec.p2p_sends:
            send_start[(it, *key)] = min(send_start.get((it, *key), float("inf")), row[6] - offsets[rank])
    frames = []
    for it in range(warmup, total):
        origin = min(rec.iteration_starts[it] - offsets[rank] for rank, rec, _l in gathered)
        rows = []
        for rank, rec, _l in gathered:
            shift = offsets[rank] + origin
            info = getattr(rec, "row_info", {})
            for i, (row_it, (stream, kind, name, layer, stage, mb, start, end)) in enumerate(rec.rows):
                if row_it == it:
                    rows.append((rank, stream, kind, name, layer, stage, mb, start - shift, end - shift,
                                 *info.get(i, NO_INFO)))  # fmt: skip
            info = getattr(rec, "send_info", {})
            for i, (row_it, key, (stream, kind, name, layer, stage, mb, start, end)) in enumerate(rec.p2p_sends):
                if row_it == it:  # a transfer ends when its receiver has it (and not before the sender is done)
                    end = max(end - shift, recv_end.get((it, *key), end - offsets[rank]) - origin)
                    start = send_start[(it, *key)] - origin
                    rows.append((rank, stream, kind, name, layer, stage, mb, start, end, *info.get(i, NO_INFO)))
        columns = ["gpu", "stream", "kind", "name", "layer", "stage", "microbatch", "start_s", "end_s", *COMM_COLUMNS]
        df = comm_dtypes(pd.DataFrame(rows, columns=columns))
        df = df.astype({"stream": "category", "kind": "category", "name": "category"})  # as a trace file reads
        df.insert(1, "node", df["gpu"] // gpus_per_node)
        frames.append(df.sort_values(["gpu", "start_s", "end_s"], kind="stable").reset_index(drop=True))
    return frames


def _capture(runtime: Any, cfg: ExecuteConfig, strategy: Any, rank: int, world: int) -> tuple[Any, Any]:
    """Before- and after-step hooks for iteration 0 that write the loss, the full gradients and the updated
    parameters (rank 0), for correctness tests.

    The gradients are replica 0's after synchronisation; under ZeRO-1, where each rank holds only its shard of the
    sum, assembled from every rank's shards (:meth:`distsim.executor.zero.Zero1.reduced_grads`). The parameters after
    the step check ZeRO-1's sharded step and all-gathers."""
    import torch

    captured: dict[str, Any] = {}

    def before() -> None:
        reduced = runtime.zero.reduced_grads() if runtime.zero is not None else None
        captured["grads"] = _full_tensors(runtime, world, lambda p: p.grad if reduced is None else reduced[id(p)])
        ls = runtime.losses[: strategy.num_micro_batches] if runtime.losses else []
        gathered: list[Any] = [ls]
        if world > 1:
            import torch.distributed as dist

            gathered = [None] * world
            dist.all_gather_object(gathered, ls)
        captured["losses"] = [x for part in gathered for x in part]

    def after() -> None:
        params = _full_tensors(runtime, world, lambda p: p)
        if rank == 0:
            losses = captured["losses"]
            loss_count = strategy.num_micro_batches * strategy.dp * strategy.tp
            loss = sum(losses) / len(losses)
            if cfg.burst:  # the last layer's ranks hold their shards' losses weighted by their share of the batch
                loss_count, loss = len(runtime.layouts[-1]), sum(losses)
            stop_if_orphaned()
            torch.save({"loss": loss, "losses": losses, "grads": captured["grads"],
                        "params": params, "expected_losses": loss_count}, cfg.check)  # fmt: skip

    return before, after


def _full_tensors(runtime: Any, world: int, tensor: Any) -> dict[str, Any]:
    """Replica 0's `tensor(parameter)` of every parameter, its tp shards concatenated (on rank 0; empty elsewhere)."""
    import torch
    import torch.distributed as dist

    local: dict[str, tuple[int, int | None, Any]] = {}
    if runtime.replica == 0:
        for (li, bi), module in runtime.modules.items():
            for name, p in module.named_parameters():
                t = tensor(p)
                if t is not None:
                    split = module.tp_split.get(name) if module.tp > 1 else None
                    local[f"L{li}.B{bi}.{name}"] = (runtime.tp_rank, split, t.detach().cpu().clone())
    gathered: list[Any] = [local]
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, local)
    parts: dict[str, list[tuple[int, int | None, Any]]] = {}
    for shards in gathered:
        for k, v in shards.items():
            parts.setdefault(k, []).append(v)
    out = {}
    for k, shards in parts.items():
        shards.sort(key=lambda x: x[0])
        split = shards[0][1]
        out[k] = torch.cat([s[2] for s in shards], dim=split) if split is not None else shards[0][2]
    return out if runtime.rank == 0 else {}


def main() -> None:
    """Entry point of a launcher-spawned rank: the configuration comes from the environment."""
    worker_main(ExecuteConfig, CONFIG_ENV, run, "distsim execute")


if __name__ == "__main__":
    main()
