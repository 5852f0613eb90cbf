"""One profiling rank: the same code under torchrun on real nodes and under `distsim profile --emulate-nodes`.

Every rank derives the same plan from the configuration (event discovery is deterministic), measures its share of
the compute events, joins every communication measurement, and sends its results to rank 0, which writes the
profile database once every rank has finished. A single process (no torchrun) profiles compute events only.

Environment (set by torchrun or by the emulation launcher): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT. DISTSIM_PIN_CPU pins a rank to one core; DISTSIM_FAULT injects a failure for tests
(``rank=1,at=compute,mode=die|hang``).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from distsim.core.errors import DistsimError
from distsim.infra.launch import WorkerConfig, inject_fault, stop_if_orphaned, worker_main

CONFIG_ENV = "DISTSIM_PROFILE_CONFIG"


@dataclass
class ProfileConfig(WorkerConfig):
    """Everything a rank needs; JSON-serialisable so the launcher can hand it to workers."""

    model: str
    cluster: str
    strategies: list[str]
    out: str
    nodes: int | None = None
    """Only for the emulation launcher's provenance; torchrun runs read the layout from the environment."""
    warmup: int = 2
    repeats: int = 10
    comm_warmup: int = 2
    comm_repeats: int = 5
    max_comm_bytes: int = 16 * 2**20
    max_group: int = 8
    max_optimizer_params: int = 32 * 2**20
    timeout_s: float = 900.0
    overwrite: bool = False
    compute: bool = True
    comm: bool = True
    self_check: bool = True
    """Time a short in-situ chain of each distinct stage's blocks against the isolated timings."""
    emulation: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    collocation: bool = False
    """Measure how a low-priority background job on rank 0's device slows the foreground
    (:mod:`distsim.profiler.collocation`)."""
    plans: list[dict[str, Any]] = field(default_factory=list)
    """Plan files' forms (``--plan``) whose events are profiled besides `strategies` (a burst plan's: compute at
    each shard size, its re-distributions and per-layer all-reduces)."""
    torch_model: str = ""
    """``module:function`` of a user's torch module (``--torch-model``), whose layers rank 0 discovers and times;
    `model` is then unused. Strategies, if any, get the example batch's micro-batch size."""


def _log(message: str) -> None:
    print(f"[distsim profile] {message}", file=sys.stderr, flush=True)


def cpu_threads(local_world: int) -> int:
    """Threads for a CPU rank: the launcher pins emulated ranks to one core each; else share this node's cores."""
    pin = os.environ.get("DISTSIM_PIN_CPU")
    if pin is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(pin)})
        return 1
    return max(1, usable_cores() // local_world)


def init_rank(local_rank: int, local_world: int, world: int, timeout_s: float) -> Any:
    """This rank's device (its local GPU, else the CPU with its share of threads) and, with several ranks, the
    process group (NCCL on GPUs, gloo on CPUs)."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(cpu_threads(local_world))
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", timeout=dt.timedelta(seconds=timeout_s))
    return device


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def check_extension(existing: Any, out: str, emulation: Any, no_comm: bool) -> None:
    """Refuse to extend a profile measured on another device, thread count or backend than this run would use."""
    import torch

    from distsim.profiler.compute import local_device_name

    world = emulation.world if emulation else int(os.environ.get("WORLD_SIZE", 1))
    local = emulation.procs_per_node if emulation else int(os.environ.get("LOCAL_WORLD_SIZE", world))
    cuda = torch.cuda.is_available()
    planned = {
        "device": local_device_name(),
        "threads_per_rank": None if cuda else (1 if emulation else max(1, usable_cores() // local)),
        "backend": ("nccl" if cuda else "gloo") if world > 1 and not no_comm else "none",
    }
    problem = existing.incompatibility(planned)
    if problem:
        raise DistsimError(f"cannot extend {out}: {problem} (use the same launch options, or --overwrite)")


@dataclass
class _Rank:
    """This process's place in the job, its device and backend, and its log (rank 0 logs, the others do not)."""

    rank: int
    world: int
    local_world: int
    device: Any
    backend: str
    log: Callable[[str], None]

    @property
    def nodes(self) -> int:
        return self.world // self.local_world


@dataclass
class _Work:
    """What every rank profiles: the model (with a user's torch module: its layer graph, and the traced module on
    rank 0), the strategies and plans, and the cluster they were discovered on and the events found (both None
    without any strategy or plan)."""

    model: Any
    traced: Any
    strategies: list[Any]
    plans: list[Any]
    cluster: Any
    found: Any


@dataclass
class _Measured:
    """This run's measurements: the compute events (every rank's, on every rank) and those that could not be built,
    the user's torch module's graph, the self-check summary and the collocation (rank 0), communication and
    interference."""

    results: dict[str, Any]
    skipped: dict[str, str]
    model_dict: dict[str, Any] | None
    self_check: dict[str, Any] | None = None
    comm: list[Any] = field(default_factory=list)
    interference: list[Any] = field(default_factory=list)
    collocation: Any = None
    host: Any = None
    """The host's speed (:class:`~distsim.sim.profile_db.HostSpeed`, rank 0): per eager operator, and per kernel of
    the measured blocks on accelerators."""


def run(cfg: ProfileConfig, traced: Any = None) -> None:
    """Profile as one rank of the job described by the environment (or alone). `traced`: the torch module of
    ``cfg.torch_model`` already traced on this rank's device (a single process need not trace it twice).

    Set-up (:func:`_join`, :func:`_discover`, :func:`_already_measured`, the reference workload), the compute events
    (:func:`_measure_compute`, :func:`_self_check`), the communication (:func:`_measure_comm`), the host's speed
    (:func:`_host_speed`, rank 0); once every rank has finished, rank 0 writes the profile (:func:`_write_profile`)."""
    import torch.distributed as dist

    from distsim.search.discovery import shard_strategies

    started = time.perf_counter()
    me, reading = _join(cfg)
    work = _discover(cfg, traced, me)
    existing, known, known_comm = _already_measured(cfg, me)
    load = _reference_at_start(reading, me.device, me.world, existing, me.log)

    measured = _measure_compute(cfg, work, known, me, started)
    checked = [*work.strategies, *shard_strategies(work.plans)]  # a plan's stages: its layers at each shard size
    if cfg.compute and cfg.self_check and measured.results and checked and not cfg.torch_model:
        measured.self_check = _self_check(work.model, work.cluster, checked, measured.results, existing, me.device,
                                          me.rank, me.world, me.log)  # fmt: skip
    elif cfg.compute and cfg.self_check and measured.results and work.traced is not None:  # rank 0 of a torch module
        from distsim.profiler.torch_timing import self_check

        measured.self_check = self_check(work.traced, measured.results, existing, me.log)

    measured.comm, measured.interference = _measure_comm(cfg, work.found, known_comm, me)
    if cfg.collocation and me.rank == 0:
        from distsim.profiler.collocation import measure_collocation

        measured.collocation = measure_collocation(me.device, progress=me.log)
    if me.rank == 0:
        measured.host = _host_speed(work, measured.results, existing, me)
    if me.world > 1:
        dist.barrier()  # every rank finished: only now may rank 0 write
    _reference_at_end(load, reading, me.device, me.world, me.log)

    if me.rank == 0:
        _write_profile(cfg, me, measured, existing, load, started)
    if me.world > 1:
        dist.destroy_process_group()


def _join(cfg: ProfileConfig) -> tuple[_Rank, dict[str, Any]]:
    """This rank's place from the environment, its device and process group (:func:`init_rank`), and its reading
    of the machine's load and cores."""
    import torch
    import torch.distributed as dist

    from distsim.profiler.reference import machine_load

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world % local_world:
        raise DistsimError(f"WORLD_SIZE {world} is not a multiple of LOCAL_WORLD_SIZE {local_world}")
    # the machine's load and cores, read before the rank is pinned to its core
    reading: dict[str, Any] = {"rank": rank, "host": socket.gethostname(), **machine_load()}
    device = init_rank(local_rank, local_world, world, cfg.timeout_s)
    cuda = device.type == "cuda"
    reading["cpu_threads"] = None if cuda else torch.get_num_threads()
    log = _log if rank == 0 else (lambda _m: None)
    backend = dist.get_backend() if world > 1 else ("nccl" if cuda else "none")
    return _Rank(rank, world, local_world, device, backend, log), reading


def _discover(cfg: ProfileConfig, traced: Any, me: _Rank) -> _Work:
    """The model (or the user's torch module: traced on rank 0, its graph sent to the others), the strategies and
    plans, and the events they need (discovery is deterministic: every rank finds the same)."""
    from distsim.core.strategy import Strategy
    from distsim.io.files import load_cluster, load_model
    from distsim.plans import plan_from_dict
    from distsim.search.discovery import discover
    from distsim.sim.costs import AnalyticCosts

    if cfg.torch_model:
        traced, model = _torch_model(cfg.torch_model, me.rank, me.world, me.device, traced)
    else:
        model = load_model(cfg.model)
    strategies = [Strategy.from_str(s) for s in cfg.strategies]
    if model.micro_batch_size is not None:  # a torch module: its example batch is the micro-batch
        strategies = [replace(s, micro_batch_size=model.micro_batch_size) for s in strategies]
    plans = [plan_from_dict(p, "--plan") for p in cfg.plans]
    cluster = found = None
    if strategies or plans:
        cluster = load_cluster(cfg.cluster)
        found = discover(model, cluster, [*strategies, *plans], AnalyticCosts(cluster))
        me.log(found.report())
    return _Work(model, traced, strategies, plans, cluster, found)


def _already_measured(cfg: ProfileConfig, me: _Rank) -> tuple[Any, set[str], set[tuple[Any, ...]]]:
    """(the profile this run extends: rank 0 loads it, the others get None; its compute events' keys and its
    communication measurements' (collective, scope, group size, bytes), sent to every rank)."""
    from distsim.io.files import load_profile

    existing = None
    if me.rank == 0 and os.path.exists(cfg.out) and not cfg.overwrite:
        existing = load_profile(cfg.out)  # only rank 0's file system has it on real nodes
    measured_comm = sorted((*m.group, m.bytes) for m in existing.comm) if existing else []
    shared: list[Any] = [sorted(existing.compute) if existing else [], measured_comm]
    if me.world > 1:
        import torch.distributed as dist

        dist.broadcast_object_list(shared, src=0)
    return existing, set(shared[0]), {tuple(x) for x in shared[1]}


def _optimizer_sizes(cfg: ProfileConfig, work: _Work) -> list[int]:
    """Parameter counts whose optimizer step is timed: the discovered ones and a sweep to fit in between (a user's
    torch module: up to its size), all at most ``cfg.max_optimizer_params``."""
    model = work.model
    wanted = work.found.optimizer.values() if work.found else []
    optimizer_sizes = sorted({int(p) for p, s in wanted if int(p) <= cfg.max_optimizer_params})
    sweep = [n for n in (2**20, 2**22, 2**24) if n <= cfg.max_optimizer_params]
    if work.traced is not None:  # a whole user module's shards: up to its size, enough for the fit in between
        sweep = [n for n in sorted({max(1, model.params // 4), max(1, model.params // 2), model.params})
                 if n <= cfg.max_optimizer_params]  # fmt: skip
    return sorted(set(optimizer_sizes) | set(sweep))


def _measure_compute(cfg: ProfileConfig, work: _Work, known: set[str], me: _Rank, started: float) -> _Measured:
    """Every rank times its share of the compute events not in the profile yet and of the optimizer steps (rank 0
    first the user's torch module's layers); every rank gets them all, and the events that could not be built."""
    measurable = work.found.measurable_compute if work.found else {}
    compute_events = sorted((k, e) for k, e in measurable.items() if k not in known and not _is_torch(e.block.op))
    optimizer_sizes = _optimizer_sizes(cfg, work)
    state_bytes = work.model.precision.state_bytes_per_param
    results: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    inject_fault(me.rank, "compute", _log)
    traced = work.traced
    model_dict = traced.model_dict() if traced is not None else None
    if cfg.compute:
        if traced is not None:
            from distsim.profiler.torch_timing import time_layers

            timed, flops = time_layers(traced, cfg.warmup, cfg.repeats, known, me.log)
            results.update(timed)
            model_dict = traced.model_dict(flops)
        _time_events(cfg, compute_events, me, results, skipped)
        _time_optimizer_steps(cfg, optimizer_sizes[me.rank :: me.world], state_bytes, me.device, results)
        me.log(f"compute done on rank 0 after {time.perf_counter() - started:.1f} s")
    if me.world > 1:
        for part, part_skipped in _gather((results, skipped), me.world):
            results.update(part)
            skipped.update(part_skipped)
    return _Measured(results, skipped, model_dict)


def _time_events(cfg: ProfileConfig, compute_events: list[tuple[str, Any]], me: _Rank, results: dict[str, Any],
                 skipped: dict[str, str]) -> None:  # fmt: skip
    """Time this rank's share of `compute_events` into `results`; an operator the profiler cannot build goes to
    `skipped` with the reason."""
    from distsim.profiler.compute import time_compute_event
    from distsim.sim.profile_db import Measurement

    mine = compute_events[me.rank :: me.world]
    for i, (key, event) in enumerate(mine):
        me.log(f"compute {i + 1}/{len(mine)} (rank 0's share of {len(compute_events)}): {key}")
        try:
            t = time_compute_event(event, me.device, warmup=cfg.warmup, repeats=cfg.repeats)
        except ValueError as exc:  # an operator the profiler cannot build
            skipped[key] = str(exc)
            continue
        results[key] = Measurement(t.median_s, t.p10_s, t.p90_s, t.repeats, t.flops, t.mean_s, t.samples_s,
                                   launch_s=t.launch_s)  # fmt: skip


def _time_optimizer_steps(cfg: ProfileConfig, sizes: list[int], state_bytes: Any, device: Any,
                          results: dict[str, Any]) -> None:  # fmt: skip
    """Time an optimizer step over each of `sizes` parameters into `results`."""
    from distsim.profiler.optim import time_optimizer_step
    from distsim.sim.profile_db import Measurement

    for params in sizes:
        key, times = time_optimizer_step(params, state_bytes, device, repeats=max(3, cfg.repeats // 2))
        times.sort()
        results[key] = Measurement(times[len(times) // 2], times[0], times[-1], len(times),
                                   mean_s=sum(times) / len(times), samples_s=tuple(times))  # fmt: skip


def _measure_comm(cfg: ProfileConfig, found: Any, known_comm: set[tuple[Any, ...]],
                  me: _Rank) -> tuple[list[Any], list[Any]]:  # fmt: skip
    """Every rank joins each communication measurement the profile lacks (the sizes swept and those discovered) and
    the interference of concurrent transfers within a node and across nodes: (measurements, interference)."""
    from distsim.profiler.comm import CommBench, measure_interference, plan_groups, sweep_sizes
    from distsim.sim.profile_db import CommMeasurement, Interference

    comm: list[CommMeasurement] = []
    interference: list[Interference] = []
    inject_fault(me.rank, "comm", _log)
    if cfg.comm and me.world > 1:
        bench = CommBench(me.device, cfg.comm_warmup, cfg.comm_repeats, progress=me.log)
        wanted = found.comm_groups if found else {}
        base = sweep_sizes(cfg.max_comm_bytes)
        for spec in plan_groups(me.nodes, me.local_world, cfg.max_group):
            exact = {
                b for b in wanted.get((spec.collective, spec.scope, spec.group_size), ()) if b <= cfg.max_comm_bytes
            }
            group = (spec.collective, spec.scope, spec.group_size)
            sizes = [b for b in sorted(set(base) | exact) if (*group, b) not in known_comm]  # only what is missing
            if sizes:
                comm += bench.measure(spec, sizes)
        pairs = ([("intra", (0, 1))] if me.local_world >= 2 else []) + (
            [("inter", (0, me.local_world))] if me.nodes >= 2 else []
        )
        for scope, ranks in pairs:
            found_i = measure_interference(bench, ranks, scope, min(16 * 2**20, cfg.max_comm_bytes))
            if found_i is not None:
                interference.append(found_i)
    return comm, interference


def _write_profile(cfg: ProfileConfig, me: _Rank, measured: _Measured, existing: Any, load: dict[str, Any],
                   started: float) -> None:  # fmt: skip
    """Rank 0, once every rank has finished: the profile database with its provenance, merged into `existing` when
    extending it, written to ``cfg.out`` (unless the launcher abandoned the run)."""
    import torch

    from distsim.io.files import write_json
    from distsim.profiler.compute import device_name
    from distsim.sim.profile_db import ProfileDB

    results, comm = measured.results, measured.comm
    elapsed = time.perf_counter() - started
    provenance = _provenance(cfg, torch, me.device, me.backend, me.world, me.local_world, me.nodes, elapsed,
                             len(results), len(comm), device_name(me.device), load)  # fmt: skip
    if measured.skipped:
        provenance["not_profiled"] = measured.skipped
    if measured.collocation is not None:
        provenance["runs"][0]["collocation_slowdown"] = measured.collocation.slowdown
    if measured.self_check is not None:
        provenance["self_check"] = provenance["runs"][0]["self_check"] = measured.self_check
    if measured.host is not None:  # each run keeps its own reading; the profile's is the latest (merged)
        provenance["runs"][0]["host_speed"] = measured.host.to_dict()
    db = ProfileDB(provenance=provenance, compute=results, comm=tuple(comm), interference=tuple(measured.interference),
                   model=measured.model_dict, collocation=measured.collocation, host=measured.host).refit()  # fmt: skip
    if existing is not None:
        db = existing.merge(db)
        me.log(f"extended {cfg.out}: now {len(db.compute)} compute events, {len(db.comm)} comm measurements")
    stop_if_orphaned()  # a launcher killed mid-run abandoned it: no profile
    write_json(cfg.out, db.to_dict(), indent=1)
    me.log(f"wrote {cfg.out}: {len(results)} compute events and {len(comm)} communication measurements "
           f"in {elapsed:.1f} s")  # fmt: skip


def _host_speed(work: _Work, results: dict[str, Any], existing: Any, me: _Rank) -> Any:
    """Rank 0: the host's speed (:class:`~distsim.sim.profile_db.HostSpeed`): its time per eager operator on this
    rank's device (:func:`distsim.profiler.host.measure_host_op_costs`) and, where compute events have a launch time
    (accelerators), the median per phase over the discovered events measured (now or in `existing`) of the launch
    time over the event's kernel count from its block's op list (:func:`distsim.sim.kernels.block_s`)."""
    import statistics

    from distsim.profiler.host import measure_host_op_costs
    from distsim.sim.kernels import block_s
    from distsim.sim.profile_db import HostSpeed

    ops = measure_host_op_costs(me.device)
    # a backward launch timed alone includes one backward call's constant, which a loop pays once per micro-batch
    constant = {"F": 0.0, "B": ops.backward_call_s}
    per_phase: dict[str, list[float]] = {"F": [], "B": []}
    if work.found is not None and work.cluster is not None:
        measured = {**(existing.compute if existing is not None else {}), **results}
        for key, event in sorted(work.found.measurable_compute.items()):
            m = measured.get(key)
            if m is None or m.launch_s is None or not event.block.ops or event.phase not in per_phase:
                continue
            _, kernels = block_s(work.cluster.gpu, event.block.ops, event.phase, event.micro_batch_size,
                                 event.effective_tp)  # fmt: skip
            if kernels > 0:
                per_phase[event.phase].append(max(0.0, m.launch_s - constant[event.phase]) / kernels)
    per_kernel = {p: statistics.median(v) for p, v in per_phase.items() if v}
    counts = {p: len(per_phase[p]) for p in per_kernel}
    host = HostSpeed(ops.forward_s, ops.backward_s, ops.method, per_kernel, counts, ops.backward_call_s)
    kernel_note = "".join(f", {p} {t * 1e6:.1f} us per kernel ({counts[p]} events)" for p, t in per_kernel.items())
    me.log(f"host speed: {ops.forward_s * 1e6:.1f} us per forward op, {ops.backward_s * 1e6:.1f} us per backward op, "
           f"{ops.backward_call_s * 1e6:.1f} us per backward call ({ops.method}){kernel_note}")  # fmt: skip
    return host


def _self_check(model: Any, cluster: Any, strategies: list[Any], results: dict[str, Any], existing: Any,
                device: Any, rank: int, world: int, log: Callable[[str], None]) -> dict[str, Any] | None:  # fmt: skip
    """Every rank times its share of the in-situ chains (distsim.profiler.insitu); rank 0 sets each measured
    event's insitu_ratio in `results` and returns the provenance summary (other ranks: None)."""
    from distsim.infra.self_check import record
    from distsim.profiler.insitu import plan_chains, run_chains

    started = time.perf_counter()
    measured = {k for k in results if not k.startswith("optimizer/")}
    chains = plan_chains(model, cluster, strategies, wanted=measured)
    timings = [t for part in _gather(run_chains(chains[rank::world], device, progress=log), world) for t in part]
    if rank != 0:
        return None
    isolated = {k: m.seconds for k, m in {**(existing.compute if existing else {}), **results}.items()}
    return record(timings, results, isolated, measured, time.perf_counter() - started, log)


def _is_torch(op: str) -> bool:
    """A layer of a user's torch module (timed by :mod:`distsim.profiler.torch_timing`, not built from a Block)."""
    return op.startswith("torch:")


def _torch_model(spec: str, rank: int, world: int, device: Any, traced: Any) -> tuple[Any, Any]:
    """(the traced module on rank 0, else None; its layer graph as a Model on every rank): only rank 0 imports and
    runs the user's code, the others get the graph from it."""
    from distsim.core.models import model_from_dict
    from distsim.profiler.torch_model import trace

    data: list[Any] = [None]
    if rank == 0:
        if traced is None or traced.device != device:
            traced = trace(spec, device)
        data = [traced.model_dict()]
    if world > 1:
        import torch.distributed as dist

        dist.broadcast_object_list(data, src=0)
    return (traced if rank == 0 else None), model_from_dict(data[0], where=spec)


def _gather(obj: Any, world: int) -> list[Any]:
    if world == 1:
        return [obj]
    import torch.distributed as dist

    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, obj)
    return gathered


def _reference_at_start(reading: dict[str, Any], device: Any, world: int, existing: Any,
                        log: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    """Every rank times the reference workload at once (as they will profile); rank 0 warns when the machine was
    busy, or, extending a profile, when the machine is now faster or slower than when the profile was measured."""
    import statistics

    from distsim.infra.machine_load import DRIFT_LIMIT, extension_warning, load_warnings
    from distsim.profiler.reference import other_cpu_use, reference_workload, time_reference

    if world > 1:
        import torch.distributed as dist

        dist.barrier()
    reading["busy_cores"] = other_cpu_use()  # every rank sleeps through the same window
    if world > 1:
        dist.barrier()
    reading["reference_start_s"] = round(time_reference(device), 7)
    ranks = sorted(_gather(reading, world), key=lambda r: r["rank"])
    load: dict[str, Any] = {"workload": reference_workload(device), "drift_limit": DRIFT_LIMIT, "ranks": ranks}
    warnings = load_warnings(ranks)
    if existing is not None:
        now_s = statistics.fmean(r["reference_start_s"] for r in ranks)
        changed = extension_warning(existing.provenance.get("runs", []), load["workload"], now_s)
        warnings += [changed] if changed else []
    for message in warnings:
        log(f"warning: {message}")
    load["warnings"] = warnings
    return load


def _reference_at_end(load: dict[str, Any], reading: dict[str, Any], device: Any, world: int,
                      log: Callable[[str], None]) -> None:  # fmt: skip
    """Every rank times the reference again; rank 0 records both readings per rank and warns when one moved."""
    from distsim.infra.machine_load import load_warnings
    from distsim.profiler.reference import time_reference

    reading["reference_end_s"] = round(time_reference(device), 7)
    load["ranks"] = sorted(_gather(reading, world), key=lambda r: r["rank"])
    for message in load_warnings(load["ranks"]):
        if message not in load["warnings"]:
            log(f"warning: {message}")
            load["warnings"].append(message)


def _provenance(cfg: ProfileConfig, torch: Any, device: Any, backend: str, world: int, local_world: int, nodes: int,
                elapsed: float, n_compute: int, n_comm: int, name: str,
                load: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    prov: dict[str, Any] = {
        "device": name,
        "backend": backend,
        "torch": torch.__version__,
        "date": now,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "nodes": nodes,
        "procs_per_node": local_world,
        "threads_per_rank": torch.get_num_threads() if device.type == "cpu" else None,
        "model": cfg.torch_model or cfg.model,
        "runs": [{"date": now, "command": cfg.command, "model": cfg.torch_model or cfg.model,
                  "strategies": cfg.strategies,
                  "backend": backend, "nodes": nodes, "procs_per_node": local_world,
                  "emulation": cfg.emulation or None, "compute_events": n_compute, "comm_measurements": n_comm,
                  "seconds": round(elapsed, 1)}],
    }  # fmt: skip
    if cfg.plans:
        prov["runs"][0]["plans"] = cfg.plans
    if load is not None:
        prov["load"] = load
        prov["runs"][0]["load"] = load
    if device.type == "cuda":
        prov["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    if world == 1:
        prov["note"] = ("one process: compute events only, no communication between ranks was measured; pair this "
                        "profile with a cluster preset's network figures")  # fmt: skip
    if cfg.emulation:
        prov["emulation"] = cfg.emulation
    return prov


def main() -> None:
    """Entry point of a launcher-spawned rank: the configuration comes from the environment."""
    worker_main(ProfileConfig, CONFIG_ENV, run, "distsim profile")


if __name__ == "__main__":
    main()
