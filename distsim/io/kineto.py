"""Per-rank PyTorch-profiler (Kineto) traces of a Timeline, for Holistic Trace Analysis (HTA) and Perfetto.

HTA reads one Kineto JSON file per rank and finds in it what this writer puts there (checked against
holistictraceanalysis 0.5.0's parser and analyzers):

* the rank in ``distributedInfo`` (HTA greps ``"rank": N`` from the top of the file, so it is written first);
* GPU kernels as ``cat: kernel`` complete events (``ph: X``) with ``args.stream`` a positive integer (HTA counts an
  event with a stream as device time; stream 0 is neither host nor device to it), ``args.device`` and a
  ``correlation``;
* communication kernels whose names start ``ncclDevKernel_`` (HTA calls a kernel communication when its name matches
  ``^nccl.*Kernel``), built from distsim's kind (``ncclDevKernel_AllReduce tp_allreduce layer0.mlp``);
* host launch rows as ``cpu_op`` events on a host thread, not kernels (they are not device time, as in distsim);
* a ``ProfilerStep#N`` ``cpu_op`` spanning the iteration (HTA numbers iterations from it);
* timestamps in integer microseconds: HTA rounds fractional timestamps in, start up and end down, which would shorten
  every kernel by up to 1 us; distsim rounds each start and end to the nearest microsecond once, so kernels that touch
  still touch and HTA computes the figures of exactly these intervals.

Figures. distsim's per-GPU compute, exposed communication and idle time add up to the iteration, from the first start
to the last end of any row of any GPU. HTA's temporal breakdown measures a rank from its first kernel's start to its
last kernel's end (``kernel_time``): on a pipeline stage that starts late that span is shorter than the iteration by
the leading bubble. Each file therefore carries two zero-length marker kernels, ``distsim iteration begin`` and
``distsim iteration end``, at the iteration's bounds on the compute stream, so that HTA's span is distsim's iteration
(as it would be in a steady-state trace of many iterations, where the bubble lies between a rank's kernels). Then,
per rank, HTA's ``compute_time`` is distsim's ``compute_s``, ``non_compute_time`` its ``exposed_comm_s`` and
``idle_time`` its ``idle_s`` (to the microsecond rounding).

A simulated timeline may hold only the GPUs that were simulated: every GPU a simulated GPU stands for gets its own
file with its own rank, made from the simulated GPU's rows, encoded once and copied with the rank patched in.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from distsim.io.output import open_output
from distsim.sim.costs import CommEvent
from distsim.sim.timeline import COMM_KINDS, COMPUTE_KINDS, HOST_KINDS, Timeline

STREAM_IDS = {"compute": 7, "tp": 13, "p2p": 17, "dp": 21, "gather": 25, "link:intra": 29, "link:inter": 33}
"""A stable CUDA-like stream id per distsim stream (7 is CUDA's default stream in Kineto traces); a stream not
named here gets 101, 102, ... in the order of its name."""
OPTIONAL_COLUMNS = ("key", "bytes", "peer", "group")
"""Columns a timeline may carry beyond the schema: written into each event's args where present."""
COLLECTIVES = {"tp_allreduce": "AllReduce", "dp_allreduce": "AllReduce", "p2p": "SendRecv",
               "ep_alltoall": "AllToAll", "cp_ring": "SendRecv"}  # fmt: skip
NCCL_NAMES = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
              "all_to_all": "AllToAll", "p2p": "SendRecv", "cp_ring": "SendRecv"}  # fmt: skip
"""An event key's collective -> NCCL's kernel name for it."""
HOST_PID = 100_000
"""Host events' pid is this plus the rank: apart from the GPU pids (the device index), as in Kineto."""
MARK = "\x01"
"""Stands for the rank (R) or device (D) in an encoded event; json.dumps never writes a raw control character."""
_ESC = json.dumps(MARK)[1:-1]
_NOT_COMPUTE = re.compile(r"Sync|Memcpy")
"""Substrings that make HTA call a kernel something other than computation."""


def rank_file(directory: str | Path, stem: str, rank: int) -> Path:
    """The file of one rank: ``<directory>/<stem>.rank<r>.json``."""
    return Path(directory) / f"{stem}.rank{rank}.json"


def _collective(kind: str, stream: str, key: str | None) -> str:
    """NCCL's name of the collective a communication row runs: its event key's collective where the row has one
    (:meth:`~distsim.sim.costs.CommEvent.of_key`), else its kind's (a parameter all-gather on the ``gather``
    stream)."""
    event = CommEvent.of_key(key) if key else None
    if event is not None and event.collective in NCCL_NAMES:
        return NCCL_NAMES[event.collective]
    if stream == "gather":
        return "AllGather"
    return COLLECTIVES.get(kind, "Generic")


def kernel_name(kind: str, name: str, stream: str, key: str | None = None) -> str:
    """The kernel name of a device row: ``ncclDevKernel_<Op> <kind> <name>`` for communication (HTA's
    communication), ``<kind> <name>`` for compute (with HTA's non-compute words lower-cased)."""
    if kind in COMPUTE_KINDS:
        return _NOT_COMPUTE.sub(lambda m: m.group(0).lower(), f"{kind} {name}")
    return f"ncclDevKernel_{_collective(kind, stream, key)} {kind} {name}"


def _stream_ids(names: list[str]) -> dict[str, int]:
    extra = sorted(n for n in names if n not in STREAM_IDS and n != "host")
    return {**STREAM_IDS, **{n: 101 + i for i, n in enumerate(extra)}}


def _us(seconds: np.ndarray, t0: float) -> np.ndarray:
    """Integer microseconds from `t0`, each time rounded once (see the module docstring)."""
    return np.rint((seconds - t0) * 1e6).astype(np.int64)


def _plain(value: Any) -> Any:
    """A JSON value of a cell: numpy scalars as Python ones, NaN and None as None."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value if isinstance(value, (int, float, str, bool)) else str(value)


def _events(rows: Any, t0: float, streams: dict[str, int]) -> list[dict[str, Any]]:
    """The encoded events of one GPU's rows (rank and device as MARK placeholders)."""
    start, end = _us(rows["start_s"].to_numpy(np.float64), t0), _us(rows["end_s"].to_numpy(np.float64), t0)
    cols = {c: rows[c].astype(str).tolist() for c in ("stream", "kind", "name")}
    ints = {c: rows[c].to_numpy().tolist() for c in ("stage", "layer", "microbatch")}
    extra = {c: rows[c].tolist() for c in OPTIONAL_COLUMNS if c in rows.columns}
    out = []
    for i in range(len(rows)):
        kind, name, stream = cols["kind"][i], cols["name"][i], cols["stream"][i]
        args: dict[str, Any] = {c: ints[c][i] for c in ints}
        for c, values in extra.items():
            value = _plain(values[i])
            if value is not None and value != "":
                args[c] = value
        ts, dur = int(start[i]), int(end[i] - start[i])
        if kind in HOST_KINDS or stream == "host":
            out.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": MARK + "H", "tid": 1, "ts": ts, "dur": dur,
                        "args": {**args, "distsim_kind": kind}})  # fmt: skip
            continue
        sid = streams[stream]
        key = args.get("key") if isinstance(args.get("key"), str) else None
        args.update(device=MARK + "D", stream=sid, correlation=i + 1, distsim_kind=kind, distsim_stream=stream)
        if kind in COMM_KINDS:
            args["collective"] = _collective(kind, stream, key)
        out.append({"ph": "X", "cat": "kernel", "name": kernel_name(kind, name, stream, key), "pid": MARK + "D",
                    "tid": sid, "ts": ts, "dur": dur, "args": args})  # fmt: skip
    return out


def _frame(span_us: int, step: int, used: list[int]) -> list[dict[str, Any]]:
    """The events every rank's file has: process and thread names, the ProfilerStep, the iteration's markers."""
    dev, host = MARK + "D", MARK + "H"

    def meta(what: str, pid: str, tid: int, label: str) -> dict[str, Any]:
        return {"ph": "M", "ts": 0, "name": what, "pid": pid, "tid": tid, "args": {"name": label}}

    names = [meta("process_name", dev, 0, "GPU " + dev), meta("process_name", host, 0, "host rank " + MARK + "R"),
             meta("thread_name", host, 1, "host thread")]  # fmt: skip
    by_id = {v: k for k, v in _stream_ids([]).items()}
    names += [meta("thread_name", dev, sid, f"stream {sid} ({by_id.get(sid, 'distsim')})") for sid in used]
    step_event = {"ph": "X", "cat": "cpu_op", "name": f"ProfilerStep#{step}", "pid": MARK + "H", "tid": 1, "ts": 0,
                  "dur": span_us, "args": {}}  # fmt: skip
    marks = [{"ph": "X", "cat": "kernel", "name": f"distsim iteration {what}", "pid": MARK + "D",
              "tid": STREAM_IDS["compute"], "ts": ts, "dur": 0,
              "args": {"device": MARK + "D", "stream": STREAM_IDS["compute"], "correlation": 0}}
             for what, ts in (("begin", 0), ("end", span_us))]  # fmt: skip
    return [*names, step_event, *marks]


def _header(rank: int, world: int, backend: str, device: int, device_name: str) -> str:
    """The top of a rank's file, ``distributedInfo`` first (HTA reads the rank from the first line naming one)."""
    info = json.dumps({"backend": backend, "rank": rank, "world_size": world})
    props = json.dumps([{"id": device, "name": device_name}])
    return (f'{{"distributedInfo": {info},\n"schemaVersion": 1,\n"deviceProperties": {props},\n'
            f'"displayTimeUnit": "ms",\n"traceName": "distsim",\n"traceEvents": [\n')  # fmt: skip


def write_kineto_traces(timeline: Timeline, directory: str | Path, stem: str = "distsim", *, backend: str = "nccl",
                        device_name: str = "distsim GPU", step: int = 0) -> list[Path]:  # fmt: skip
    """Write one Kineto trace per GPU of `timeline` (every GPU a simulated GPU stands for) into `directory`, as
    ``<stem>.rank<gpu>.json``; return their paths in rank order. The directory must exist (see
    :func:`distsim.io.rank_traces.write_rank_traces`, which makes it)."""
    df = timeline.df
    t0 = float(df["start_s"].min()) if len(df) else 0.0
    span = int(_us(np.asarray([float(df["end_s"].max())]), t0)[0]) if len(df) else 0
    streams = _stream_ids(df["stream"].astype(str).unique().tolist())
    world = len(timeline.gpus)
    codes = df["gpu"].to_numpy()
    written: dict[int, Path] = {}

    def body_of(rows: Any) -> str:
        events = _events(rows, t0, streams)
        used = sorted({e["tid"] for e in events if e["cat"] == "kernel"} | {STREAM_IDS["compute"]})
        return ",\n".join(json.dumps(e, separators=(",", ":")) for e in [*_frame(span, step, used), *events])

    for rep, targets in sorted(timeline.represents.items()):
        rows = df[codes == rep]
        own = "group" in rows.columns and ((rows["peer"] >= 0).any() or (rows["group"].astype(str) != "").any())
        shared = body_of(rows)
        for gpu in targets:
            # a GPU with peers or groups of its own (Timeline.copied) is encoded for itself
            body = body_of(timeline.copied(rep, (gpu,), codes == rep)) if own and gpu != rep else shared
            device = gpu % timeline.gpus_per_node
            text = body.replace(f'"{_ESC}D"', str(device)).replace(f'"{_ESC}H"', str(HOST_PID + gpu))
            text = text.replace(f"{_ESC}D", str(device)).replace(f"{_ESC}R", str(gpu))  # inside names
            content = _header(gpu, world, backend, device, device_name) + text + "\n]}\n"
            path = rank_file(directory, stem, gpu)
            with open_output(path) as fh:  # atomic; an OSError is one line naming the file
                fh.write(content)
            written[gpu] = path
    return [written[g] for g in sorted(written)]
