"""Cluster-trace jobs and their readers: the shipped synthetic CSV and the Microsoft Philly job log (JSON).

A :class:`Job` is what the inter-job schedulers (:mod:`distsim.elastic.scheduler`) need: when it arrives, its gang
size, its EasyScale maxP (ESTs), its work and its capability per GPU type. Work is in mini-batches (one EST's
mini-batch), so a job's throughput is in mini-batches/s and its capability ``C_i`` (EasyScale Eq. 1) is the
mini-batches/s one GPU of type ``i`` sustains for it. The trace gives a job's runtime at its requested gang on the
fastest GPU type; its work is that runtime times the gang's throughput (``gpus x C_max``).

Readers are the only code here that touches files.

* ``*.csv``: the synthetic format (:func:`read_csv`, written by :func:`write_csv`), one job per row with columns
  ``job_id, arrival_s, gpus, max_workers, duration_s, model``, one ``cap_<TYPE>`` column per GPU type and an
  optional ``gpu_type`` (the type YARN-CS must give the job; empty: any).
* ``*.json``: the Philly ``cluster_job_log`` (github.com/msr-fiddle/philly-traces), a list of jobs with ``jobid``,
  ``submitted_time``, ``attempts`` [{``start_time``, ``end_time``, ``detail`` [{``ip``, ``gpus`` [...]}]}],
  ``status``, ``user``, ``vc``. Mapping (:func:`read_philly`): arrival = submitted_time minus the first job's;
  gpus = the GPUs of the last attempt (summed over its machines); duration = the last attempt's end minus its start
  (earlier attempts are failures that a simulator's jobs do not repeat); maxP = gpus; the model is unknown in Philly,
  so job k gets model ``k mod len(MODELS)`` of :mod:`distsim.elastic.synth`, with that model's capabilities. Jobs
  with no attempt, no start/end time or no GPU are skipped (they never ran).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from distsim.errors import DistsimError


class TraceError(DistsimError, ValueError):
    """A cluster job trace that cannot be read or describes an impossible job."""


@dataclass(frozen=True)
class Job:
    """One training job of a cluster trace."""

    job_id: str
    arrival_s: float
    """Submission time, seconds from the trace's start."""
    gpus: int
    """Gang size requested (YARN-CS allocates exactly this many GPUs of one type)."""
    max_workers: int
    """EasyScale's maxP: the job's ESTs; it never uses more GPUs than this."""
    duration_s: float
    """Runtime at the requested gang on the fastest GPU type."""
    model: str
    capabilities: Mapping[str, float] = field(default_factory=dict)
    """Mini-batches/s one GPU of each type sustains for this job (EasyScale's C_i); 0 or absent: cannot use it."""
    gpu_type: str | None = None
    """The GPU type a gang scheduler must give it (YARN-CS "based on its requirement"); None: the fastest that fits."""

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.max_workers < 1:
            raise TraceError(f"job {self.job_id}: gpus and max_workers must be >= 1")
        if self.duration_s <= 0 or self.arrival_s < 0:
            raise TraceError(f"job {self.job_id}: needs duration_s > 0 and arrival_s >= 0")
        if not any(c > 0 for c in self.capabilities.values()):
            raise TraceError(f"job {self.job_id}: no GPU type with a positive capability")
        if self.gpu_type is not None and self.capabilities.get(self.gpu_type, 0) <= 0:
            raise TraceError(f"job {self.job_id}: requires {self.gpu_type} but has no capability on it")

    @property
    def work(self) -> float:
        """Mini-batches to process: the runtime times the requested gang's throughput on the fastest type."""
        return self.duration_s * self.gpus * max(self.capabilities.values())


def read_trace(path: str) -> list[Job]:
    """A trace file by its extension: ``.csv`` (synthetic format) or ``.json`` (Philly cluster_job_log)."""
    if path.endswith(".csv"):
        return read_csv(path)
    if path.endswith(".json"):
        return read_philly(path)
    raise TraceError(f"{path}: a cluster trace is .csv (synthetic format) or .json (Philly cluster_job_log)")


def _open(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None


def read_csv(path: str) -> list[Job]:
    rows = list(csv.DictReader(_open(path).splitlines()))
    need = {"job_id", "arrival_s", "gpus", "max_workers", "duration_s", "model"}
    if not rows or not need <= set(rows[0]):
        raise TraceError(f"{path}: expected CSV columns {', '.join(sorted(need))} and cap_<TYPE>")
    jobs = []
    for i, row in enumerate(rows, start=2):
        try:
            caps = {k[4:]: float(v) for k, v in row.items() if k.startswith("cap_") and v not in ("", None)}
            jobs.append(Job(row["job_id"], float(row["arrival_s"]), int(row["gpus"]), int(row["max_workers"]),
                            float(row["duration_s"]), row["model"], caps, row.get("gpu_type") or None))  # fmt: skip
        except (ValueError, TypeError) as exc:
            raise TraceError(f"{path}:{i}: {exc}") from None
    return sorted(jobs, key=lambda j: j.arrival_s)


def write_csv(jobs: Sequence[Job], path: str) -> None:
    types = sorted({t for j in jobs for t in j.capabilities})
    pinned = any(j.gpu_type for j in jobs)
    with open(path, "w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["job_id", "arrival_s", "gpus", "max_workers", "duration_s", "model", *(f"cap_{t}" for t in types),
                    *(["gpu_type"] if pinned else [])])  # fmt: skip
        for j in jobs:
            w.writerow([j.job_id, f"{j.arrival_s:.1f}", j.gpus, j.max_workers, f"{j.duration_s:.1f}", j.model,
                        *(f"{j.capabilities.get(t, 0.0):g}" for t in types),
                        *([j.gpu_type or ""] if pinned else [])])  # fmt: skip


def _philly_time(value: Any) -> float | None:
    """Philly writes times as '2017-10-03 02:41:08' (or None); seconds since the epoch, naive."""
    if not value or value == "None":
        return None
    try:
        return datetime.strptime(str(value), "%Y-%m-%d %H:%M:%S").timestamp()
    except ValueError:
        return None


def read_philly(path: str) -> list[Job]:
    from distsim.elastic.synth import MODELS

    try:
        data = json.loads(_open(path))
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, list):
        raise TraceError(f"{path}: a Philly cluster_job_log is a JSON list of jobs")
    parsed = []
    for entry in data:
        if not isinstance(entry, dict) or "jobid" not in entry or "submitted_time" not in entry:
            raise TraceError(f"{path}: every job needs jobid and submitted_time (Philly cluster_job_log schema)")
        submitted, attempts = _philly_time(entry["submitted_time"]), entry.get("attempts") or []
        if submitted is None or not attempts:
            continue
        last = attempts[-1]
        start, end = _philly_time(last.get("start_time")), _philly_time(last.get("end_time"))
        gpus = sum(len(d.get("gpus") or []) for d in last.get("detail") or [])
        if start is None or end is None or end <= start or gpus < 1:
            continue
        parsed.append((submitted, str(entry["jobid"]), gpus, end - start))
    if not parsed:
        raise TraceError(f"{path}: no job that ran (with an attempt's start_time, end_time and GPUs)")
    parsed.sort()
    t0, names = parsed[0][0], sorted(MODELS)
    jobs = []
    for k, (submitted, jobid, gpus, duration) in enumerate(parsed):
        model = names[k % len(names)]
        jobs.append(Job(jobid, submitted - t0, gpus, gpus, duration, model, dict(MODELS[model])))
    return jobs
