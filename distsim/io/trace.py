"""A measured trace: the plan that ran, where it ran, and one timeline per measured iteration.

Schema (JSON, ``schema: distsim-trace``, ``version: 1``)::

    {
      "schema": "distsim-trace", "version": 1,
      "plan": {"model": "gpt2-cpu", "cluster": "cpu-2x1", "nodes": 2, "strategy": "tp=1 pp=2 dp=1 ... partition=4:2",
               "p2p_blocking": false, "seed": 0, "iterations": 5, "warmup": 2, "emulation": {...}},
      "provenance": {"device": ..., "backend": "gloo", "torch": ..., "date": ..., "threads_per_rank": 1,
                     "timing": {"device_clock": "perf_counter", "host_rows": false, "anchor": null, ...}, ...},
      "losses": [[...per micro-batch loss of replica 0...], ...],
      "iterations": [{"iteration": 2, "columns": {"gpu": [...], "node": [...], "stream": [...], ...}}, ...]
    }

Every iteration's times start at 0 (the earliest rank's start of that iteration); columns are the Timeline schema,
with :data:`~distsim.sim.timeline.COMM_COLUMNS` (``key``, ``bytes``, ``peer``, ``group``: what the executor recorded of
each event, :mod:`distsim.executor.keys`). Traces written before those columns lack them and read with
:data:`COMM_DEFAULTS` (no key, 0 bytes, no peer, no group); the version stays 1, since a reader of either kind reads
both (an older reader takes only the columns it knows).

``provenance.timing`` says how the times were taken (:mod:`distsim.executor.clock`): ``device_clock`` is
``perf_counter`` (CPU: the host's span of each synchronous call) or ``cuda_event`` (GPU: CUDA events on the stream
each event ran on, mapped onto the host's ``perf_counter`` by one ``anchor`` per iteration), ``streams`` the clock of
each stream, and ``host_rows`` whether the host's launch spans are rows of a ``host`` stream (kind ``launch``; the
last, ``synchronize``, ends the iteration on the host). Traces written before it have no ``timing``: their times are
``perf_counter`` spans, which on a GPU are kernel-launch spans, not the GPU's (:attr:`Trace.timing`).
The Chrome trace written beside a measured trace (``*.chrome.json``, for viewers) is read back by
:func:`chrome_rows`; :func:`chrome_gpus` maps its process ids to GPUs, for traces numbered either way (see there).
This module is pure: reading and writing files lives in ``distsim.io.files``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from distsim.core.checks import positive_int
from distsim.core.errors import DistsimError
from distsim.sim.metrics import iteration_time
from distsim.sim.timeline import COLUMNS, COMM_COLUMNS, Timeline

SCHEMA = "distsim-trace"
VERSION = 1
PLAN_KEYS = ("model", "cluster", "nodes", "strategy", "p2p_blocking")
HOST_TIMING: dict[str, Any] = {"device_clock": "perf_counter", "host_clock": "perf_counter", "host_rows": False,
                               "anchor": None}  # fmt: skip
"""``provenance.timing`` of a trace that records none (written before it existed): host-clock spans."""
COMM_DEFAULTS: dict[str, Any] = {"key": "", "bytes": 0, "peer": -1, "group": ""}
"""The :data:`~distsim.sim.timeline.COMM_COLUMNS` of a row that says nothing beyond its times (every row of a trace
written before them)."""


def comm_dtypes(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with the :data:`~distsim.sim.timeline.COMM_COLUMNS` as a simulated timeline has them (categorical key and
    group, int64 bytes, int32 peer), each one it lacks filled with its :data:`COMM_DEFAULTS`."""
    for c, default in COMM_DEFAULTS.items():
        if c not in df.columns:
            df[c] = default
    df["key"] = df["key"].astype(str).astype("category")
    df["group"] = df["group"].astype(str).astype("category")
    df["bytes"] = df["bytes"].astype(np.int64)
    df["peer"] = df["peer"].astype(np.int32)
    return df


class TraceError(DistsimError):
    """A trace file that is missing, malformed, or does not fit what it is compared with."""


@dataclass
class Trace:
    plan: dict[str, Any]
    provenance: dict[str, Any] = field(default_factory=dict)
    iterations: list[pd.DataFrame] = field(default_factory=list)
    losses: list[list[float]] = field(default_factory=list)

    @property
    def timing(self) -> dict[str, Any]:
        """How the times were taken (``provenance.timing``; for older traces, the host clock they used)."""
        return dict(self.provenance.get("timing") or HOST_TIMING)

    @property
    def host_timed_gpu(self) -> bool:
        """A GPU run timed by the host clock (a trace written before CUDA events were recorded): its iteration times
        are right, its per-event times are the host's kernel-launch spans, not the GPU's."""
        on_gpu = self.provenance.get("backend") == "nccl" or (
            "threads_per_rank" in self.provenance and self.provenance["threads_per_rank"] is None
        )  # the executor records no thread count on a GPU
        return on_gpu and self.timing.get("device_clock") != "cuda_event"

    def timeline(self, i: int, gpus_per_node: int) -> Timeline:
        """Measured iteration i as a timeline, with :data:`~distsim.sim.timeline.COMM_COLUMNS` (their defaults for
        frames built without them)."""
        df = self.iterations[i].copy()
        return Timeline(df if set(COMM_COLUMNS) <= set(df.columns) else comm_dtypes(df), gpus_per_node)

    @property
    def iteration_times_s(self) -> list[float]:
        return [iteration_time(Timeline(df, 1)) for df in self.iterations]  # the node size does not matter to it

    @property
    def median_iteration_s(self) -> float:
        return statistics.median(self.iteration_times_s)

    @property
    def iteration_spread(self) -> float:
        """(max - min) / median of the measured iteration times (:func:`distsim.sim.validate.iteration_spread`)."""
        from distsim.sim.validate import iteration_spread

        return iteration_spread(self.iteration_times_s)

    def median_index(self) -> int:
        """The measured iteration whose time is the median (the lower one for an even count)."""
        times = self.iteration_times_s
        order = sorted(range(len(times)), key=lambda i: times[i])
        return order[(len(order) - 1) // 2]

    def to_dict(self) -> dict[str, Any]:
        iterations = []
        for i, df in enumerate(self.iterations):
            names = [*COLUMNS, *(c for c in COMM_COLUMNS if c in df.columns)]
            cols = {c: (df[c].astype(str) if c in ("stream", "kind", "name", "key", "group") else df[c]).tolist()
                    for c in names}  # fmt: skip
            iterations.append({"iteration": int(self.plan.get("warmup", 0)) + i, "columns": cols})
        return {"schema": SCHEMA, "version": VERSION, "plan": self.plan, "provenance": self.provenance,
                "losses": self.losses, "iterations": iterations}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Any, where: str = "trace") -> Trace:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise TraceError(
                f"{where}: not a distsim trace (schema {data.get('schema') if isinstance(data, dict) else None!r})"
            )
        if data.get("version") != VERSION:
            raise TraceError(f"{where}: trace schema version {data.get('version')!r}; this distsim reads {VERSION}")
        plan = data.get("plan")
        if not isinstance(plan, dict) or any(k not in plan for k in PLAN_KEYS):
            raise TraceError(f"{where}: the plan must give {', '.join(PLAN_KEYS)}")
        plan = {**plan, "nodes": positive_int(plan["nodes"], f"{where}: plan nodes", TraceError)}
        for key in ("model", "cluster", "strategy"):
            if not isinstance(plan[key], str):
                raise TraceError(f"{where}: plan {key} must be a string, got {plan[key]!r}")
        frames = []
        try:
            for it in data.get("iterations", []):
                cols = it["columns"]
                df = pd.DataFrame({c: cols[c] for c in COLUMNS})
                for c in ("stream", "kind", "name"):
                    df[c] = df[c].astype("category")
                df = comm_dtypes(df.assign(**{c: cols[c] for c in COMM_COLUMNS if c in cols}))
                times = df[["start_s", "end_s"]].to_numpy(dtype=float)
                if not np.isfinite(times).all():
                    raise TraceError(f"{where}: iteration {len(frames)} has a start_s or end_s that is not finite")
                frames.append(df)
        except (KeyError, TypeError, ValueError) as exc:
            raise TraceError(f"{where}: malformed iteration ({exc.__class__.__name__}: {exc})") from None
        if not frames:
            raise TraceError(f"{where}: the trace has no measured iterations")
        return cls(plan, dict(data.get("provenance", {})), frames, list(data.get("losses", [])))


def chrome_gpus(events: Iterable[dict[str, Any]]) -> dict[int, int]:
    """Process id -> GPU of a Chrome trace distsim wrote, from its ``process_name`` metadata events.

    GPU g is pid g + 1 (pid 0 is Perfetto's idle process), and the ``process_name`` event says so by giving the GPU
    (``args.gpu``); traces written before that (the committed ``traces/*.chrome.json``) give none and have pid = GPU.
    The marker is read per process, never guessed from the numbers."""
    out: dict[int, int] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            gpu = (e.get("args") or {}).get("gpu", e["pid"])
            if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0:
                raise TraceError(f"process {e['pid']}: GPU {gpu!r} is not a GPU number")
            out[e["pid"]] = gpu
    return out


def chrome_rows(data: dict[str, Any], where: str = "trace") -> pd.DataFrame:
    """The slices of a Chrome trace distsim wrote as timeline rows: gpu, stream, kind, name, layer, stage,
    microbatch, start_s and end_s (times from the trace's start; names without the `` mbN`` the trace adds)."""
    try:
        events = data["traceEvents"]
        gpus = chrome_gpus(events)
        threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
                   if e.get("ph") == "M" and e.get("name") == "thread_name"}  # fmt: skip
        rows = []
        for e in (e for e in events if e.get("ph") == "X"):
            args, name = e.get("args") or {}, e["name"]
            mb = int(args.get("microbatch", -1))
            if mb >= 0 and name.endswith(f" mb{mb}"):
                name = name[: -len(f" mb{mb}")]
            start = float(e["ts"]) * 1e-6
            rows.append((gpus[e["pid"]], threads[e["pid"], e["tid"]], e["cat"], name, int(args.get("layer", -1)),
                         int(args.get("stage", -1)), mb, start, start + float(e["dur"]) * 1e-6))  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TraceError(f"{where}: not a Chrome trace distsim wrote ({exc.__class__.__name__}: {exc})") from None
    columns = ["gpu", "stream", "kind", "name", "layer", "stage", "microbatch", "start_s", "end_s"]
    return pd.DataFrame(rows, columns=columns)
