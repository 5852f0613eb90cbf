"""Cluster-trace jobs and their readers: the shipped synthetic CSV and the Microsoft Philly job log (JSON).

A :class:`Job` is what the inter-job schedulers (:mod:`distsim.elastic.scheduler`) need: when it arrives, its gang
size, its EasyScale maxP (ESTs), its work and its capability per GPU type. Work is in mini-batches (one EST's
mini-batch), so a job's throughput is in mini-batches/s and its capability ``C_i`` (EasyScale Eq. 1) is the
mini-batches/s one GPU of type ``i`` sustains for it. The trace gives a job's runtime at its requested gang on the
fastest GPU type; its work is that runtime times the gang's throughput (``gpus x C_max``).

Readers are the only code here that touches files. They check every number where they read it (finite, in range:
:data:`MAX_TRACE_S`, :data:`MAX_CAPABILITY`, ``MAX_GPUS``; a :class:`Job` built in Python is checked the same way)
and say what is wrong in one line naming the file, the line (CSV) or entry (JSON), the job and the field; bytes that
are not UTF-8 are one line giving their offset and line. A trace of more than ``max_jobs`` jobs is refused
(:class:`TraceTooLarge`) without keeping them.

* ``*.csv``: the synthetic format (:func:`read_csv`, written by :func:`write_csv`), one job per row with columns
  ``job_id, arrival_s, gpus, max_workers, duration_s, model``, one ``cap_<TYPE>`` column per GPU type and an
  optional ``gpu_type`` (the type YARN-CS must give the job; empty: any).
* ``*.json``: the Philly ``cluster_job_log`` (github.com/msr-fiddle/philly-traces), a list of jobs with ``jobid``,
  ``submitted_time``, ``attempts`` [{``start_time``, ``end_time``, ``detail`` [{``ip``, ``gpus`` [...]}]}],
  ``status``, ``user``, ``vc``. Mapping (:func:`read_philly`): arrival = submitted_time minus the first job's;
  gpus = the GPUs of the last attempt (summed over its machines); duration = the last attempt's end minus its start
  (earlier attempts are failures that a simulator's jobs do not repeat); maxP = gpus; the model is unknown in Philly,
  so job k gets model ``k mod len(MODELS)`` of :mod:`distsim.elastic.workloads`, with that model's capabilities. Jobs
  with no attempt, no start/end time or no GPU are skipped (they never ran).
"""

from __future__ import annotations

import codecs
import csv
import itertools
import json
import math
import numbers
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any

from distsim.core.checks import integer
from distsim.core.cluster import MAX_GPUS
from distsim.core.errors import DistsimError

MAX_TRACE_S = 1e9
"""Largest arrival or runtime a trace may give, in seconds (about 32 years). Beyond some 10^7 s the simulator's
clock, a float, resolves a job's last mini-batches coarsely; far beyond, times overflow."""

MAX_CAPABILITY = 1e6
"""Largest C_i (mini-batches/s on one GPU) a trace may give; a positive C_i below ``MIN_CAPABILITY`` is refused too
(0 means the job cannot use that type), so runtimes on the slowest type stay finite."""
MIN_CAPABILITY = 1e-6

MAX_LINE_BYTES = 1 << 20
"""A CSV line longer than this (1 MiB) is refused rather than read: a job's row is under a hundred bytes."""

MAX_JSON_BYTES_PER_JOB = 2048
"""A Philly JSON trace is loaded whole, so one larger than this many bytes per allowed job (``max_jobs``) is refused
before it is read. Philly's entries take about 300 bytes a job (a 100,000-job log of one attempt each: 27 MB, read in
4 s at 314 MB peak RSS); a 79 MB file of 1,000,000 short entries took 17 s and 711 MB, so at the default 20,000 jobs
a file of up to 41 MB is read: about 10 s and 400 MB at most (2-core AMD EPYC, ``/usr/bin/time``)."""

REQUIRED = ("job_id", "arrival_s", "gpus", "max_workers", "duration_s", "model")


class TraceError(DistsimError, ValueError):
    """A cluster job trace that cannot be read or describes an impossible job."""


class TraceTooLarge(TraceError):
    """A trace with more jobs than the limit it was read or simulated under (``max_jobs``, the CLI's ``--max-jobs``)."""


def too_many_jobs(what: str, jobs: int, max_jobs: int) -> TraceTooLarge:
    """The one-line refusal of a trace of `jobs` jobs over `max_jobs`."""
    return TraceTooLarge(f"{what} has {jobs:,} jobs, above the limit of {max_jobs:,}; simulate fewer jobs, or raise "
                         "the limit with --max-jobs (max_jobs= in Python)")  # fmt: skip


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
        _check_job(self, f"job {_name(self.job_id)}")

    @property
    def work(self) -> float:
        """Mini-batches to process: the runtime times the requested gang's throughput on the fastest type."""
        return self.duration_s * self.gpus * max(self.capabilities.values())


def _check_job(job: Job, where: str) -> None:
    """Every field in range (finite numbers, counts that are integers), else one line starting with `where`."""
    for key in ("gpus", "max_workers"):
        value = getattr(job, key)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value <= MAX_GPUS:
            raise TraceError(f"{where}: {key} must be an integer from 1 to {MAX_GPUS:,}, got {value!r}")
    for key, least in (("arrival_s", "a finite number >= 0"), ("duration_s", "a finite positive number")):
        value = getattr(job, key)
        if not (_real(value) and math.isfinite(value) and (value >= 0 if key == "arrival_s" else value > 0)):
            raise TraceError(f"{where}: {key} must be {least} (seconds), got {value!r}")
        if value > MAX_TRACE_S:
            raise TraceError(f"{where}: {key} is {value:.10g} s, above the limit of {MAX_TRACE_S:,.0f} s")
    for t, c in job.capabilities.items():
        what = f"{where}: cap_{t}"
        if not _real(c) or not math.isfinite(c) or c < 0:
            raise TraceError(f"{what} must be a finite number >= 0 (mini-batches/s; 0: cannot use {t}), got {c!r}")
        if c > MAX_CAPABILITY or 0 < c < MIN_CAPABILITY:
            raise TraceError(f"{what} is {c:g}, outside {MIN_CAPABILITY:g} to {MAX_CAPABILITY:g} mini-batches/s "
                             f"(0: cannot use {t})")  # fmt: skip
    if not any(c > 0 for c in job.capabilities.values()):
        raise TraceError(f"{where}: no GPU type with a positive capability (cap_<TYPE>)")
    if job.gpu_type is not None and job.capabilities.get(job.gpu_type, 0) <= 0:
        raise TraceError(f"{where}: requires {job.gpu_type} (gpu_type) but has no capability on it")


def _float(text: str, what: str) -> float:
    """A CSV field as a float (its range is :func:`_check_job`'s), else one line naming it."""
    try:
        return float(text)
    except ValueError:
        raise TraceError(f"{what} must be a number, got {text[:40]!r}") from None


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _name(job_id: str, limit: int = 40) -> str:
    text = repr(job_id)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _job(where: str, *args: Any) -> Job:
    """A Job of these fields, its errors starting with `where` (file and line or entry) instead of the job's id."""
    try:
        return Job(*args)
    except TraceError as exc:
        raise TraceError(f"{where}: {str(exc).removeprefix(f'job {_name(args[0])}: ')}") from None


def read_trace(path: str, max_jobs: int | None = None) -> list[Job]:
    """A trace file by its extension: ``.csv`` (synthetic format) or ``.json`` (Philly cluster_job_log); more than
    `max_jobs` jobs (None: no limit) is refused (:class:`TraceTooLarge`) without keeping them."""
    if path.endswith(".csv"):
        return read_csv(path, max_jobs)
    if path.endswith(".json"):
        return read_philly(path, max_jobs)
    raise TraceError(f"{path}: a cluster trace is .csv (synthetic format) or .json (Philly cluster_job_log)")


def _open(path: str) -> IO[bytes]:
    try:
        return open(path, "rb")
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from None


def _decode(data: bytes, path: str, offset: int = 0, line: int = 1) -> str:
    """`data` (from byte `offset` and line `line` of `path`) as UTF-8 text; a bad byte is one line saying where."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        at, line = offset + exc.start, line + data.count(b"\n", 0, exc.start)
        raise TraceError(f"{path}: not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {at:,} (line {line}); "
                         "save the trace as UTF-8") from None  # fmt: skip


def _lines(fh: IO[bytes], path: str) -> Iterator[str]:
    """The file's lines as text, one at a time (a UTF-8 byte-order mark dropped): bounded memory and a bad byte
    located by its offset and line."""
    offset = 0
    for number_ in itertools.count(1):
        raw = fh.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        if len(raw) > MAX_LINE_BYTES:
            raise TraceError(f"{path}:{number_}: line longer than {MAX_LINE_BYTES:,} bytes; not a cluster trace")
        start = len(codecs.BOM_UTF8) if number_ == 1 and raw.startswith(codecs.BOM_UTF8) else 0
        yield _decode(raw[start:], path, offset + start, number_)
        offset += len(raw)


def read_csv(path: str, max_jobs: int | None = None) -> list[Job]:
    """The synthetic CSV format (module docstring), every field checked where it is read; more than `max_jobs` rows
    (None: no limit) is refused after counting them, keeping no more than `max_jobs` jobs."""
    with _open(path) as fh:
        reader = csv.reader(_lines(fh, path))
        try:
            header = [h.strip() for h in next(reader, [])]
            jobs, rows = _csv_jobs(reader, fh, header, path, max_jobs)
        except csv.Error as exc:
            raise TraceError(f"{path}:{reader.line_num}: malformed CSV ({exc})") from None
    if max_jobs is not None and rows > max_jobs:
        raise too_many_jobs(path, rows, max_jobs)
    return sorted(jobs, key=lambda j: j.arrival_s)


def _csv_jobs(reader: Any, fh: IO[bytes], header: list[str], path: str, max_jobs: int | None) -> tuple[list[Job], int]:
    """The jobs of the rows after the header, and how many rows there are (beyond `max_jobs`, the lines left)."""
    expected = f"expected CSV columns {', '.join(REQUIRED)} and cap_<TYPE>"
    if not any(header):
        raise TraceError(f"{path}: empty file; {expected}")
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise TraceError(f"{path}: no column {', '.join(missing)} in the header; {expected}")
    repeated = sorted({h for h in header if header.count(h) > 1})
    if repeated:
        raise TraceError(f"{path}: column {', '.join(repeated)} appears twice in the header")
    caps = [(i, h[4:]) for i, h in enumerate(header) if h.startswith("cap_") and h[4:]]
    if not caps:
        raise TraceError(f"{path}: no cap_<TYPE> column (a job's mini-batches/s per GPU of that type); {expected}")
    col = {h: i for i, h in enumerate(header)}
    jobs: list[Job] = []
    seen: dict[str, int] = {}
    rows = 0
    for row in reader:
        if not any(cell.strip() for cell in row):
            continue  # a blank line
        rows += 1
        if max_jobs is not None and rows > max_jobs:
            return jobs, rows + _count_lines(fh)  # the rest counted, not read: the caller refuses the trace
        line = reader.line_num
        if len(row) < len(header) and not any(col[c] >= len(row) for c in REQUIRED):
            row += [""] * (len(header) - len(row))  # optional trailing fields left out: empty
        if len(row) != len(header):
            raise TraceError(f"{path}:{line}: {len(row)} fields, the header has {len(header)}")
        job_id = row[col["job_id"]].strip()
        if not job_id:
            raise TraceError(f"{path}:{line}: job_id is empty")
        if job_id in seen:
            raise TraceError(f"{path}:{line}: job {_name(job_id)} again (first on line {seen[job_id]})")
        seen[job_id] = line
        where = f"{path}:{line} job {_name(job_id)}"
        cell = {h: row[i].strip() for h, i in col.items()}
        arrival, duration = (_float(cell[k], f"{where}: {k}") for k in ("arrival_s", "duration_s"))
        gpus, workers = (integer(cell[k], f"{where}: {k}", TraceError, 1, MAX_GPUS) for k in ("gpus", "max_workers"))
        capabilities = {t: _float(row[i], f"{where}: cap_{t}") for i, t in caps if row[i].strip()}
        gpu_type = cell.get("gpu_type") or None
        jobs.append(_job(where, job_id, arrival, gpus, workers, duration, cell["model"], capabilities, gpu_type))
    if not rows:
        raise TraceError(f"{path}: no jobs: the header has every column but no row follows")
    return jobs, rows


def _count_lines(fh: IO[bytes]) -> int:
    """Lines left in `fh` (a last one without a newline included), counted in 1 MiB chunks."""
    count, last = 0, b"\n"
    while chunk := fh.read(1 << 20):
        count, last = count + chunk.count(b"\n"), chunk[-1:]
    return count + (last != b"\n")


def write_csv(jobs: Sequence[Job], fh: IO[str]) -> None:
    """Write `jobs` as a synthetic-format CSV trace to the text stream `fh`."""
    types = sorted({t for j in jobs for t in j.capabilities})
    pinned = any(j.gpu_type for j in jobs)
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


def read_philly(path: str, max_jobs: int | None = None) -> list[Job]:
    """The Philly cluster_job_log (module docstring); a file too large for `max_jobs` jobs (None: no limit) at
    :data:`MAX_JSON_BYTES_PER_JOB` is refused before it is loaded, and more than `max_jobs` jobs that ran after."""
    from distsim.elastic.workloads import MODELS

    with _open(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if max_jobs is not None and size > max_jobs * MAX_JSON_BYTES_PER_JOB:
            raise TraceTooLarge(f"{path}: {size:,} bytes, more than a trace of at most {max_jobs:,} jobs takes "
                                f"({MAX_JSON_BYTES_PER_JOB:,} bytes a job); raise the limit with --max-jobs "
                                "(max_jobs= in Python)")  # fmt: skip
        raw = fh.read()
    text = _decode(raw[len(codecs.BOM_UTF8) :] if raw.startswith(codecs.BOM_UTF8) else raw, path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise TraceError(f"{path}: not a Philly cluster_job_log (JSON nested too deep)") from None
    if not isinstance(data, list):
        raise TraceError(f"{path}: a Philly cluster_job_log is a JSON list of jobs")
    parsed = []
    seen: dict[str, int] = {}
    for k, entry in enumerate(data):
        if not isinstance(entry, dict) or "jobid" not in entry or "submitted_time" not in entry:
            raise TraceError(f"{path}: job #{k}: every job needs jobid and submitted_time (Philly cluster_job_log "
                             "schema)")  # fmt: skip
        jobid = str(entry["jobid"])
        where = f"{path}: job #{k} ({_name(jobid)})"
        if jobid in seen:
            raise TraceError(f"{where}: jobid again (first at job #{seen[jobid]})")
        seen[jobid] = k
        ran = _philly_ran(entry, where)
        if ran is not None:
            parsed.append((ran[0], jobid, ran[1], ran[2], where))
    if not parsed:
        raise TraceError(f"{path}: no job that ran (with an attempt's start_time, end_time and GPUs)")
    if max_jobs is not None and len(parsed) > max_jobs:
        raise too_many_jobs(path, len(parsed), max_jobs)
    parsed.sort()
    t0, names = parsed[0][0], sorted(MODELS)
    jobs = []
    for k, (submitted, jobid, gpus, duration, where) in enumerate(parsed):
        model = names[k % len(names)]
        jobs.append(_job(where, jobid, submitted - t0, gpus, gpus, duration, model, dict(MODELS[model])))
    return jobs


def _philly_ran(entry: Mapping[str, Any], where: str) -> tuple[float, int, float] | None:
    """(submitted, GPUs, runtime) of a Philly job from its last attempt; None if it never ran."""
    submitted, attempts = _philly_time(entry["submitted_time"]), entry.get("attempts") or []
    if not isinstance(attempts, list) or not all(isinstance(a, dict) for a in attempts):
        raise TraceError(f"{where}: attempts must be a list of objects (Philly cluster_job_log schema)")
    if submitted is None or not attempts:
        return None
    last = attempts[-1]
    start, end = _philly_time(last.get("start_time")), _philly_time(last.get("end_time"))
    detail = last.get("detail") or []
    if not isinstance(detail, list) or not all(isinstance(d, dict) and isinstance(d.get("gpus") or [], list)
                                               for d in detail):  # fmt: skip
        raise TraceError(f"{where}: an attempt's detail must be a list of objects with a gpus list")
    gpus = sum(len(d.get("gpus") or []) for d in detail)
    if start is None or end is None or end <= start or gpus < 1:
        return None
    return submitted, gpus, end - start
