"""Streaming exports of a Timeline: Chrome trace JSON (plain or gzip), Perfetto's protobuf trace, CSV.

The format follows the file name (:func:`trace_format`): ``*.json.gz`` is gzip-compressed JSON (Perfetto and
chrome://tracing open it), ``*.pftrace`` / ``*.perfetto-trace`` is Perfetto's native protobuf format (a process track
per GPU, a thread track per stream, interned names, about 70 bytes per slice against 150 in JSON), anything else
is JSON. No GPU is process 0, which Perfetto takes for the idle (swapper) process: in JSON GPU g is pid g + 1
(:func:`json_pid`), in protobuf (g + 1) x 1000.

Writers never materialise the expanded timeline: with ``expand`` every GPU a simulated GPU stands for gets that GPU's
rows, encoded once per simulated GPU and copied with the GPU's ids patched in, so memory stays that of the
simulated timeline however many GPUs are written, and the work per written event is a copy. Events come per GPU in
GPU order, each GPU's rows by start and end time: the order of the expanded timeline.
"""

from __future__ import annotations

import gzip
import json
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

from distsim.io import perfetto as pf
from distsim.sim.timeline import STREAM_ORDER, Timeline, format_ranges

FORMATS = {"json": "Chrome trace JSON", "json.gz": "gzip-compressed Chrome trace JSON",
           "pftrace": "Perfetto protobuf trace"}  # fmt: skip
GZIP_LEVEL = 6
"""zlib level of ``*.json.gz``: level 6 compresses distsim's JSON ~12x at ~60 MB/s here, level 1 ~9x at ~200 MB/s."""
WARN_BYTES = 1_000_000_000
"""Warn before writing a trace whose uncompressed size is estimated above this. Perfetto's in-browser UI typically
gets ~2 GB of memory and holds a trace in 2-4x its protobuf size (perfetto.dev/docs/visualization/large-traces);
a 900 MB JSON trace already crashed it (google/perfetto#99)."""
PID_MARK = "\x01"  # stands for the pid in a JSON template; json.dumps never writes a raw control character
_CHUNK_BYTES = 1 << 20
_SAMPLE_ROWS = 20_000
# Perfetto track uuids: BASE + gpu * STRIDE + k (k = 0: the GPU's process track, 1..: its stream tracks), all 5-byte
# varints, so a simulated GPU's encoded slices are copied to the GPUs it stands for by patching fixed-width bytes.
_UUID_BASE = 1 << 28
_UUID_STRIDE = 256
_UUID_BYTES = 5
_SEQUENCE_ID = 1
_ANNOTATIONS = ("stage", "layer", "microbatch")


def trace_format(path: str | Path) -> str:
    """'json', 'json.gz' or 'pftrace', from the file name (``-`` and unknown suffixes: 'json')."""
    name = str(path).lower()
    if name.endswith((".pftrace", ".perfetto-trace")):
        return "pftrace"
    if name.endswith(".json.gz"):
        return "json.gz"
    return "json"


@dataclass(frozen=True)
class TraceEstimate:
    format: str
    events: int
    """Slices (rows) the trace holds."""
    bytes: float
    """Estimated size of the file."""
    loaded_bytes: float
    """Estimated size of what a viewer parses (the file, uncompressed)."""
    collapsed_events: int
    """Slices without expansion (one row set per group of identical GPUs)."""


def _codes(series: pd.Series) -> tuple[np.ndarray, list[str]]:
    """Integer codes and their labels, for categorical and plain columns alike."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        return series.cat.codes.to_numpy(), [str(c) for c in series.cat.categories]
    codes, uniques = pd.factorize(series.astype(str), sort=False)
    return codes.astype(np.int64), [str(u) for u in uniques]


def _ints(series: pd.Series) -> np.ndarray:
    """An integer column without a copy where it already is one (int32 in simulated timelines)."""
    values = series.to_numpy()
    return values if np.issubdtype(values.dtype, np.integer) else values.astype(np.int64)


def _combine(*columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row groups of equal values over several integer columns: (inverse index per row, first row of each group)."""
    if not len(columns[0]):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    key = np.zeros(len(columns[0]), dtype=np.int64)
    radix = 1
    for col in columns:
        lo, span = int(col.min()), int(col.max()) - int(col.min()) + 1
        radix *= span
        key = key * span + (col.astype(np.int64) - lo)
    if radix >= 1 << 62:  # the mixed-radix key would overflow: group the rows as tuples instead
        _, first, inverse = np.unique(np.stack(columns, axis=1), axis=0, return_index=True, return_inverse=True)
    else:
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return inverse.reshape(-1), first


class TraceSource:
    """A timeline prepared for streaming export: columns as arrays, each simulated GPU's rows, the GPUs to write."""

    def __init__(self, timeline: Timeline, expand: bool = False):
        df = timeline.df
        self.timeline, self.expand = timeline, expand
        self.gpus_per_node = timeline.gpus_per_node
        self.start = df["start_s"].to_numpy(np.float64)
        self.end = df["end_s"].to_numpy(np.float64)
        self.t0 = float(self.start.min()) if len(df) else 0.0
        self.stream, stream_names = _codes(df["stream"])
        self.kind, self.kind_names = _codes(df["kind"])
        self.name, self.name_names = _codes(df["name"])
        self.layer, self.stage, self.microbatch = (_ints(df[c]) for c in ("layer", "stage", "microbatch"))
        present = {stream_names[c] for c in np.unique(self.stream)}
        self.streams = [s for s in STREAM_ORDER if s in present] + sorted(present - set(STREAM_ORDER))
        self.tid = np.full(len(stream_names), -1, dtype=np.int64)  # stream code -> thread id (JSON)
        self.stream_code: dict[str, int] = {}
        for code, s in enumerate(stream_names):
            if s in present:
                self.tid[code] = self.streams.index(s)
                self.stream_code[s] = code
        gpu = df["gpu"].to_numpy(np.int64)
        order = np.arange(len(gpu)) if bool(np.all(gpu[1:] >= gpu[:-1])) else np.argsort(gpu, kind="stable")
        reps, first = np.unique(gpu[order], return_index=True)
        ends = [*first[1:].tolist(), len(gpu)]
        self._order = order
        self._bounds = {rep: (a, b) for rep, a, b in zip(reps.tolist(), first.tolist(), ends, strict=True)}
        represents = timeline.represents
        if expand:
            self.gpus = sorted((g, rep) for rep, targets in represents.items() for g in targets)
        else:
            self.gpus = [(rep, rep) for rep in sorted(represents)]
        self.events = sum(self.count(rep) for _, rep in self.gpus)
        self.collapsed_events = len(df)

    def count(self, rep: int) -> int:
        a, b = self._bounds.get(rep, (0, 0))
        return b - a

    def rows(self, rep: int) -> np.ndarray:
        """Row indices of one simulated GPU, by start then end time (stable, as Timeline.expand sorts)."""
        a, b = self._bounds.get(rep, (0, 0))
        idx = self._order[a:b]
        return idx[np.lexsort((self.end[idx], self.start[idx]))]

    def label(self, gpu: int) -> str:
        label = f"GPU {gpu} (node {gpu // self.gpus_per_node})"
        targets = self.timeline.represents.get(gpu, (gpu,))
        if not self.expand and len(targets) > 1:
            label += f" - stands for {len(targets)} GPUs: {format_ranges(targets)}"
        return label

    def display_name(self, name_code: int, microbatch: int) -> str:
        name = self.name_names[name_code]
        return f"{name} mb{microbatch}" if microbatch >= 0 else name

    def times_us(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Start and duration in microseconds rounded to ns, as the JSON writes them."""
        return np.round((self.start[idx] - self.t0) * 1e6, 3), np.round((self.end[idx] - self.start[idx]) * 1e6, 3)

    def times_ns(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Begin and end in integer nanoseconds (each rounded, so back-to-back slices stay back to back)."""
        return (np.rint((self.start[idx] - self.t0) * 1e9).astype(np.int64),
                np.rint((self.end[idx] - self.t0) * 1e9).astype(np.int64))  # fmt: skip

    @cached_property
    def name_iids(self) -> tuple[np.ndarray, list[str]]:
        """Interned event name id of every row (1-based) and the names in iid order."""
        if not len(self.name):
            return np.zeros(0, dtype=np.int64), []
        inverse, first = _combine(self.name, np.maximum(self.microbatch, -1))
        names = [self.display_name(int(self.name[i]), int(self.microbatch[i])) for i in first]
        return inverse + 1, names

    @cached_property
    def json_heads(self) -> tuple[np.ndarray, list[str], np.ndarray, list[str]]:
        return _json_heads(self)

    def templates(self, make: Callable[[int], Any]) -> Iterator[tuple[int, int, Any]]:
        """(gpu, its simulated GPU, that one's template) in GPU order; a template is made once, kept while needed."""
        remaining: dict[int, int] = {}
        for _, rep in self.gpus:
            remaining[rep] = remaining.get(rep, 0) + 1
        cache: dict[int, Any] = {}
        for gpu, rep in self.gpus:
            template = cache.pop(rep) if rep in cache else make(rep)
            remaining[rep] -= 1
            if remaining[rep]:
                cache[rep] = template
            yield gpu, rep, template


# ----------------------------------------------------------------------------------------------------- events (dicts)
def json_pid(gpu: int) -> int:
    """Process id of a GPU in a JSON trace: GPU + 1, since Perfetto takes pid 0 for the idle (swapper) process.

    The process_name event also gives the GPU (``args.gpu``): that marks the traces numbered so, and readers
    (:func:`distsim.io.trace.chrome_gpus`) map pids back by it; traces written before it have pid = GPU."""
    return gpu + 1


def _metadata(src: TraceSource, gpu: int) -> list[dict[str, Any]]:
    pid = json_pid(gpu)
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": src.label(gpu), "gpu": gpu}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": gpu}},
    ]
    for i, s in enumerate(src.streams):
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": i, "args": {"name": s}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": i, "args": {"sort_index": i}})
    return out


def iter_chrome_events(timeline: Timeline, expand: bool = False) -> Iterator[dict[str, Any]]:
    """Trace events one by one: metadata naming each GPU (process) and stream (thread), then 'X' events in us.

    With `expand`, every GPU a simulated GPU stands for, without building the expanded timeline."""
    src = TraceSource(timeline, expand)
    for gpu, _ in src.gpus:
        yield from _metadata(src, gpu)
    for gpu, rep in src.gpus:
        idx = src.rows(rep)
        ts, dur = src.times_us(idx)
        cols = (src.name[idx], src.kind[idx], src.stream[idx], src.layer[idx], src.stage[idx], src.microbatch[idx])
        for name, kind, stream, layer, stage, mb, t, d in zip(*(c.tolist() for c in cols), ts.tolist(), dur.tolist(),
                                                               strict=True):  # fmt: skip
            args: dict[str, Any] = {"stage": stage}
            if layer >= 0:
                args["layer"] = layer
            if mb >= 0:
                args["microbatch"] = mb
            yield {"name": src.display_name(name, mb), "cat": src.kind_names[kind], "ph": "X", "pid": json_pid(gpu),
                   "tid": int(src.tid[stream]), "ts": t, "dur": d, "args": args}  # fmt: skip


# -------------------------------------------------------------------------------------------------------- JSON text
def _json_metadata(src: TraceSource, gpu: int) -> str:
    return ",\n".join(json.dumps(e, separators=(",", ":")) for e in _metadata(src, gpu))


def _json_heads(src: TraceSource) -> tuple[np.ndarray, list[str], np.ndarray, list[str]]:
    """Every row's JSON text before its start time and after its duration, as an index into texts made once per
    distinct (name, microbatch, kind, stream) and (stage, layer, microbatch) over the whole timeline."""
    name, kind, stream = src.name, src.kind, src.stream
    layer, stage, mb = src.layer, src.stage, np.maximum(src.microbatch, -1)
    head_of, first = _combine(name, mb, kind, stream)
    heads = [
        f',\n{{"name":{json.dumps(src.display_name(int(name[i]), int(mb[i])))},'
        f'"cat":{json.dumps(src.kind_names[int(kind[i])])},"ph":"X","pid":{PID_MARK},"tid":{int(src.tid[stream[i]])},'
        '"ts":'
        for i in first
    ]
    tail_of, first = _combine(stage, np.maximum(layer, -1), mb)
    tails = []
    for i in first:
        args = f'"stage":{int(stage[i])}'
        if layer[i] >= 0:
            args += f',"layer":{int(layer[i])}'
        if mb[i] >= 0:
            args += f',"microbatch":{int(mb[i])}'
        tails.append(f',"args":{{{args}}}}}')
    return head_of, heads, tail_of, tails


def _json_template(src: TraceSource, rep: int, idx: np.ndarray | None = None) -> str:
    """The 'X' events of one simulated GPU, each after ',\\n', with PID_MARK where the pid goes."""
    idx = src.rows(rep) if idx is None else idx
    if not len(idx):
        return ""
    ts, dur = src.times_us(idx)
    head_of, heads, tail_of, tails = src.json_heads
    return "".join([
        f'{heads[h]}{t!r},"dur":{d!r}{tails[a]}'
        for h, t, d, a in zip(head_of[idx].tolist(), ts.tolist(), dur.tolist(), tail_of[idx].tolist(), strict=True)
    ])  # fmt: skip


def _write_json(out: _Out, src: TraceSource, title: str) -> None:
    out.write(f'{{"displayTimeUnit":"ms","otherData":{json.dumps({"title": title})},"traceEvents":[\n'.encode())
    for i, (gpu, _) in enumerate(src.gpus):
        out.write(((",\n" if i else "") + _json_metadata(src, gpu)).encode())
    mark = PID_MARK.encode()
    for gpu, rep, template in src.templates(lambda rep: _json_template(src, rep).encode()):
        out.write(template.replace(mark, str(json_pid(gpu)).encode()), events=src.count(rep))
    out.write(b"\n]}\n")


# ---------------------------------------------------------------------------------------------------- Perfetto proto
@dataclass
class _ProtoTemplate:
    data: np.ndarray
    """Begin and end packets of every slice of one simulated GPU, encoded for track uuids of GPU 0."""
    uuid_at: np.ndarray
    """Where each packet's 5-byte track uuid starts in `data`."""
    track_of: np.ndarray
    """Which of the GPU's tracks (k) each of those uuids names."""
    tracks: list[tuple[str, int]]
    """(stream, lane) of track k = 1, 2, ...; a stream gets more lanes only where its slices overlap."""

    @cached_property
    def uuid_bytes(self) -> np.ndarray:
        """Every byte of every track uuid in `data`, uuid by uuid."""
        return (self.uuid_at[:, None] + np.arange(_UUID_BYTES)[None, :]).reshape(-1)


def _lanes(begin: np.ndarray, end: np.ndarray) -> np.ndarray:
    """A lane per slice so that no two slices of a lane overlap (slices sorted by begin); all 0 when none do."""
    if len(begin) < 2 or bool(np.all(begin[1:] >= np.maximum.accumulate(end)[:-1])):
        return np.zeros(len(begin), dtype=np.int64)
    lane_end: list[int] = []
    lanes = np.empty(len(begin), dtype=np.int64)
    for i, (b, e) in enumerate(zip(begin.tolist(), end.tolist(), strict=True)):
        for j, last in enumerate(lane_end):
            if last <= b:
                lane_end[j], lanes[i] = e, j
                break
        else:
            lanes[i] = len(lane_end)
            lane_end.append(e)
    return lanes


def _uuid(gpu: int, k: int) -> int:
    return _UUID_BASE + gpu * _UUID_STRIDE + k


def _proto_template(src: TraceSource, rep: int, idx: np.ndarray | None = None) -> _ProtoTemplate:
    idx = src.rows(rep) if idx is None else idx
    begin, end = src.times_ns(idx)
    stream = src.stream[idx]
    track = np.zeros(len(idx), dtype=np.int64)
    tracks: list[tuple[str, int]] = []
    for s_name in src.streams:
        on = np.flatnonzero(stream == src.stream_code[s_name])
        if not len(on):
            continue
        lanes = _lanes(begin[on], end[on])
        for lane in range(int(lanes.max()) + 1):
            tracks.append((s_name, lane))
            track[on[lanes == lane]] = len(tracks)
    if len(tracks) >= _UUID_STRIDE:
        raise ValueError(f"GPU {rep}: {len(tracks)} tracks, more than {_UUID_STRIDE - 1} can be written")
    n = len(idx)
    uuid0 = np.asarray([_uuid(0, k) for k in range(_UUID_STRIDE)], dtype=np.int64)[track]
    layer, mb = src.layer[idx], src.microbatch[idx]

    def annotation(name_iid: int, values: np.ndarray) -> pf.Records:
        return pf.Records(n).uint_field(pf.ANNOTATION_NAME_IID, name_iid).uint_field(pf.ANNOTATION_INT_VALUE, values)

    slice_begin = (
        pf.Records(n)
        .uint_field(pf.EVENT_TYPE, pf.TYPE_SLICE_BEGIN)
        .const(pf.key(pf.EVENT_TRACK_UUID, pf.VARINT)).mark("begin_uuid").varint(uuid0)
        .uint_field(pf.EVENT_NAME_IID, src.name_iids[0][idx])
        .uint_field(pf.EVENT_CATEGORY_IIDS, src.kind[idx].astype(np.int64) + 1)
        .message(pf.EVENT_DEBUG_ANNOTATIONS, annotation(1, src.stage[idx]))
        .message(pf.EVENT_DEBUG_ANNOTATIONS, annotation(2, layer), present=layer >= 0)
        .message(pf.EVENT_DEBUG_ANNOTATIONS, annotation(3, mb), present=mb >= 0)
    )  # fmt: skip
    slice_end = (
        pf.Records(n)
        .uint_field(pf.EVENT_TYPE, pf.TYPE_SLICE_END)
        .const(pf.key(pf.EVENT_TRACK_UUID, pf.VARINT)).mark("end_uuid").varint(uuid0)
    )  # fmt: skip
    sequence = pf.uint_field(pf.PACKET_SEQUENCE_ID, _SEQUENCE_ID)
    begin_packet = (
        pf.Records(n).uint_field(pf.PACKET_TIMESTAMP, begin).message(pf.PACKET_TRACK_EVENT, slice_begin)
        .const(sequence + pf.uint_field(pf.PACKET_SEQUENCE_FLAGS, pf.SEQ_NEEDS_INCREMENTAL_STATE))
    )  # fmt: skip
    end_packet = (
        pf.Records(n).uint_field(pf.PACKET_TIMESTAMP, end).message(pf.PACKET_TRACK_EVENT, slice_end).const(sequence)
    )
    pair = pf.Records(n).message(pf.TRACE_PACKET, begin_packet).message(pf.TRACE_PACKET, end_packet)
    data, starts = pair.build()
    uuid_at = np.concatenate([starts["begin_uuid"], starts["end_uuid"]])
    return _ProtoTemplate(data, uuid_at, np.concatenate([track, track]), tracks)


def _proto_header(src: TraceSource) -> bytes:
    """The first packet (interned names, incremental state cleared) and the root track's ordering hints."""
    names = src.name_iids[1]
    interned = (
        pf.interned_entries(pf.INTERNED_EVENT_CATEGORIES, src.kind_names)
        + pf.interned_entries(pf.INTERNED_EVENT_NAMES, names)
        + pf.interned_entries(pf.INTERNED_DEBUG_ANNOTATION_NAMES, list(_ANNOTATIONS))
    )
    first = pf.packet(
        pf.uint_field(pf.PACKET_SEQUENCE_ID, _SEQUENCE_ID)
        + pf.uint_field(pf.PACKET_SEQUENCE_FLAGS, pf.SEQ_INCREMENTAL_STATE_CLEARED)
        + pf.uint_field(pf.PACKET_FIRST_ON_SEQUENCE, 1)
        + pf.bytes_field(pf.PACKET_INTERNED_DATA, interned)
    )
    root = pf.uint_field(pf.TRACK_UUID, 0) + pf.uint_field(pf.TRACK_PROCESS_ORDERING, pf.ORDERING_EXPLICIT)
    root += pf.uint_field(pf.TRACK_THREAD_ORDERING, pf.ORDERING_EXPLICIT)
    return first + pf.packet(pf.bytes_field(pf.PACKET_TRACK_DESCRIPTOR, root))


def _proto_pid(gpu: int) -> int:
    """Process id of a GPU in a Perfetto protobuf trace: (GPU + 1) x 1000, its streams' thread ids the next ones
    (pid 0 is the idle process, and thread ids share the process ids' namespace)."""
    return (gpu + 1) * 1000


def _proto_descriptors(src: TraceSource, gpu: int, tracks: list[tuple[str, int]]) -> bytes:
    """A process track for the GPU and a thread track per stream (per lane of a stream whose slices overlap)."""
    pid = _proto_pid(gpu)
    process = pf.uint_field(pf.PROCESS_PID, pid) + pf.str_field(pf.PROCESS_NAME, src.label(gpu))
    out = [
        pf.uint_field(pf.TRACK_UUID, _uuid(gpu, 0))
        + pf.bytes_field(pf.TRACK_PROCESS, process)
        + pf.uint_field(pf.TRACK_CHILD_ORDERING, pf.CHILD_ORDERING_EXPLICIT)
        + pf.uint_field(pf.TRACK_SIBLING_ORDER_RANK, gpu)
    ]
    for k, (stream, lane) in enumerate(tracks, start=1):
        name = stream if lane == 0 else f"{stream} ({lane + 1})"
        thread = pf.uint_field(pf.THREAD_PID, pid) + pf.uint_field(pf.THREAD_TID, pid + k)
        out.append(
            pf.uint_field(pf.TRACK_UUID, _uuid(gpu, k))
            + pf.uint_field(pf.TRACK_PARENT_UUID, _uuid(gpu, 0))
            + pf.bytes_field(pf.TRACK_THREAD, thread + pf.str_field(pf.THREAD_NAME, name))
            + pf.uint_field(pf.TRACK_SIBLING_ORDER_RANK, k)
        )
    return b"".join(pf.packet(pf.bytes_field(pf.PACKET_TRACK_DESCRIPTOR, d)) for d in out)


def _patched(template: _ProtoTemplate, gpu: int) -> bytes:
    if gpu == 0 or not len(template.uuid_at):
        return template.data.tobytes()
    table = np.frombuffer(b"".join(pf.varint(_uuid(gpu, k)) for k in range(len(template.tracks) + 1)), np.uint8)
    data = template.data.copy()
    data[template.uuid_bytes] = table.reshape(-1, _UUID_BYTES)[template.track_of].reshape(-1)
    return data.tobytes()


def _write_proto(out: _Out, src: TraceSource) -> None:
    last = max((g for g, _ in src.gpus), default=0)
    if _uuid(last + 1, 0) >= 1 << (7 * _UUID_BYTES) or _proto_pid(last) + _UUID_STRIDE >= 1 << 31:
        raise ValueError(f"GPU {last}: too many GPUs for this Perfetto trace layout")
    out.write(_proto_header(src))
    for gpu, _, template in src.templates(lambda rep: _proto_template(src, rep)):
        out.write(_proto_descriptors(src, gpu, template.tracks))
        out.write(_patched(template, gpu), events=len(template.uuid_at) // 2)


# --------------------------------------------------------------------------------------------------- writing, estimate
class _Out:
    """Buffered writes to a binary file, counting events for a progress callback."""

    def __init__(self, fh: IO[bytes], total: int, progress: Callable[[int, int], None] | None):
        self.fh, self.total, self.progress = fh, total, progress
        self.buffer: list[bytes] = []
        self.size = 0
        self.done = 0
        self.last = time.perf_counter()

    def write(self, data: bytes, events: int = 0) -> None:
        self.buffer.append(data)
        self.size += len(data)
        if self.size >= _CHUNK_BYTES:
            self.flush()
        self.done += events
        if self.progress is not None and events and time.perf_counter() - self.last > 0.5:
            self.last = time.perf_counter()
            self.progress(self.done, self.total)

    def flush(self) -> None:
        self.fh.write(b"".join(self.buffer))
        self.buffer, self.size = [], 0


def estimate(src: TraceSource, fmt: str) -> TraceEstimate:
    """Size of the trace: bytes per event and per GPU measured on a sample (up to 20,000 rows of the first simulated
    GPU) times the events and GPUs to write; for gzip, the sample's compression ratio."""
    rep = next((rep for _, rep in src.gpus if src.count(rep)), None)
    idx = src.rows(rep)[:_SAMPLE_ROWS] if rep is not None else np.zeros(0, dtype=np.int64)
    first_gpu = src.gpus[0][0] if src.gpus else 0
    sample = b""
    if fmt == "pftrace":
        template = _proto_template(src, rep, idx) if rep is not None else None
        per_event = len(template.data) / len(idx) if template is not None else 0.0
        per_gpu = len(_proto_descriptors(src, first_gpu, template.tracks if template else []))
    else:
        sample = _json_template(src, rep, idx).encode() if rep is not None else b""
        per_event = len(sample) / len(idx) if len(idx) else 0.0
        per_gpu = len(_json_metadata(src, first_gpu)) + 2 if src.gpus else 0
    loaded = per_event * src.events + per_gpu * len(src.gpus)
    written = loaded * len(zlib.compress(sample, GZIP_LEVEL)) / len(sample) if fmt == "json.gz" and sample else loaded
    return TraceEstimate(fmt, src.events, written, loaded, src.collapsed_events)


def _size(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.0f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def _stem(path: str | Path) -> str:
    name = Path(str(path)).name
    for suffix in (".json.gz", ".pftrace", ".perfetto-trace", ".json"):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def warning_text(path: str | Path, est: TraceEstimate, src: TraceSource) -> str:
    """One line: how big the trace will be, why that is a problem, and what to write instead."""
    what = {"json": "JSON", "json.gz": "gzip-compressed JSON", "pftrace": "Perfetto protobuf"}[est.format]
    size = _size(est.bytes) + (f" ({_size(est.loaded_bytes)} to decompress)" if est.format == "json.gz" else "")
    options = []
    if est.format != "pftrace":
        proto = estimate(src, "pftrace")
        options.append(f"{_stem(path)}.pftrace (Perfetto's protobuf format, about {_size(proto.bytes)})")
    if est.format == "json":
        gz = estimate(src, "json.gz")
        options.append(f"{_stem(path)}.json.gz (about {_size(gz.bytes)} to store, the same JSON to load)")
    if est.format == "pftrace":
        options.append("trace_processor --httpd for the UI to load it (perfetto.dev/docs/visualization/large-traces)")
    if src.expand and est.collapsed_events < est.events:
        options.append(f"dropping --all-gpus ({est.collapsed_events:,} events: one row set per group of alike GPUs)")
    return (f"warning: {path}: {est.events:,} events, about {size} of {what}; Perfetto's in-browser UI typically fails "
            f"on traces above ~1 GB; consider {', or '.join(options)}")  # fmt: skip


def write_trace(
    fh: IO[bytes],
    src: TraceSource,
    fmt: str,
    title: str,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Write the trace of `src` in format `fmt` to the binary file `fh`."""
    if fmt == "json.gz":
        with gzip.GzipFile(filename="", mode="wb", fileobj=fh, compresslevel=GZIP_LEVEL, mtime=0) as gz:
            write_trace(gz, src, "json", title, progress)  # type: ignore[arg-type]
        return
    out = _Out(fh, src.events, progress)
    if fmt == "pftrace":
        _write_proto(out, src)
    else:
        _write_json(out, src, title)
    out.flush()
    if progress is not None:
        progress(src.events, src.events)


# ------------------------------------------------------------------------------------------------------------- CSV
def write_csv(fh: IO[str], timeline: Timeline, expand: bool = False) -> None:
    """The timeline as CSV (every GPU's rows with `expand`), one simulated GPU's rows formatted at a time."""
    if not expand or timeline.is_expanded:
        timeline.df.to_csv(fh, index=False)
        return
    src = TraceSource(timeline, expand=True)
    df = timeline.df
    fh.write(",".join(df.columns) + "\n")
    if "group" in df.columns:  # each GPU's own groups and peers: its rows formatted one GPU at a time
        rep_of = {g: rep for rep, targets in timeline.represents.items() for g in targets}
        rows = {rep: src.rows(rep) for rep in timeline.represents}
        for gpu in sorted(rep_of):
            timeline.copied(rep_of[gpu], (gpu,), rows[rep_of[gpu]]).to_csv(fh, index=False, header=False)
        return

    def template(rep: int) -> str:
        rows = df.iloc[src.rows(rep)].copy()
        rows["gpu"], rows["node"] = "\x01", "\x02"
        return rows.to_csv(index=False, header=False)

    for gpu, _, text in src.templates(template):
        fh.write(text.replace("\x01", str(gpu)).replace("\x02", str(gpu // timeline.gpus_per_node)))
