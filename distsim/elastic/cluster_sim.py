"""Discrete-event simulation of a job trace on a GPU cluster under an inter-job scheduler.

Events are job arrivals, job completions and scheduling rounds. After every event the scheduler runs one round
(:mod:`distsim.elastic.scheduler`); an elastic scheduler that granted something runs its next round ``round_s``
later, so a job grows at most one grant (at most a doubling) per round, as EasyScale's proposal loop does. Between
events a job's remaining work (mini-batches) falls at its current allocation's throughput (the estimate: EasyScale's
Eq. 1 planner by default). Rescaling is free here: the paper's on-demand checkpoint and restart take seconds.

Metrics: JCT (finish - arrival; mean, p50, p95), makespan (last finish - first arrival) and the GPU allocation ratio
over time (allocated GPUs / cluster GPUs), whose time-weighted mean is reported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from distsim.core.errors import DistsimError, suggest
from distsim.elastic.jobs import Job, TraceError, too_many_jobs
from distsim.elastic.scheduler import ESTIMATES, SCHEDULERS, Estimate, Grant, Scheduler

Capability = Callable[[Job], Mapping[str, float]]
Progress = Callable[[int, int], None]

DEFAULT_MAX_JOBS = 20_000
"""Most jobs one :func:`simulate_cluster` call (and ``distsim cluster-sim``'s trace) may have; above it the run is
refused before it starts (``max_jobs`` raises it; the CLI's ``--max-jobs``).

Measured on this project's machine (2-core AMD EPYC, shared with other work) with ``/usr/bin/time -f "%e s %M KB"
distsim cluster-sim --trace syn-N.csv --scheduler S --max-jobs 1000000``, syn-N.csv from ``python -m
distsim.elastic.synth --jobs N --seed 0`` (the shipped trace's shape: overloaded, the queue grows all along) on the
default cluster V100:32,P100:16,T4:16; wall seconds (a one-job run takes 0.9 s of start-up):

====== ======= ============== =========
jobs   yarn-cs easyscale-homo easyscale
====== ======= ============== =========
 1,000   0.95        1.38        1.61
 4,000   0.99        3.70        4.87
 8,000   2.01        9.34        9.04
16,000   3.82       24.9        28.1
32,000  16.4        70.7        65.5
====== ======= ============== =========

The cost per job grows with the trace (about 1 ms at 4,000 jobs, 2 ms at 32,000, per EasyScale run), as the queue
does: every event lists the active jobs. Peak RSS grows by about 1.2 KB per job (90 MB at 1,000 jobs, 127 MB at
32,000). So a run at the limit stays near a minute: 20,000 jobs under all three schedulers (the default ``both``)
took 71 s and 125 MB here (load 3 on the 2 cores); the 1,000,000-job trace that ran for over 10 minutes at 1.5 GB
before this limit is refused in 2.3 s (the reader counts the rows past the limit without keeping them)."""


@dataclass
class ClusterSimResult:
    """What one scheduler did with one trace."""

    scheduler: str
    gpus: dict[str, int]
    arrival_s: dict[str, float]
    finish_s: dict[str, float]
    processed: dict[str, float]
    """Mini-batches each job processed (equals its work: work conservation)."""
    allocated: list[tuple[float, int]] = field(default_factory=list)
    """(time, GPUs allocated from then on)."""
    grants: list[tuple[float, Grant]] = field(default_factory=list)
    peak: dict[str, int] = field(default_factory=dict)
    """Most GPUs of each type allocated at once (never above the cluster's)."""

    @property
    def jct_s(self) -> list[float]:
        return sorted(self.finish_s[j] - self.arrival_s[j] for j in self.finish_s)

    @property
    def jct_mean_s(self) -> float:
        return sum(self.jct_s) / len(self.jct_s)

    def jct_percentile_s(self, q: float) -> float:
        """Nearest-rank percentile, q in (0, 100]."""
        values = self.jct_s
        return values[max(0, math.ceil(q / 100 * len(values)) - 1)]

    @property
    def makespan_s(self) -> float:
        return max(self.finish_s.values()) - min(self.arrival_s.values())

    @property
    def mean_allocation_ratio(self) -> float:
        """Time-weighted allocated/total GPUs from the first arrival to the last finish."""
        end, total = max(self.finish_s.values()), sum(self.gpus.values())
        area = 0.0
        for (t0, n), (t1, _) in zip(self.allocated, [*self.allocated[1:], (end, 0)], strict=True):
            area += n * (min(t1, end) - t0)
        return area / (total * self.makespan_s) if self.makespan_s > 0 else 0.0

    def summary(self) -> dict[str, float | str | int]:
        return {"scheduler": self.scheduler, "jobs": len(self.finish_s), "jct_mean_s": self.jct_mean_s,
                "jct_p50_s": self.jct_percentile_s(50), "jct_p95_s": self.jct_percentile_s(95),
                "makespan_s": self.makespan_s, "mean_allocation_ratio": self.mean_allocation_ratio}  # fmt: skip


def get_scheduler(name: str) -> Scheduler:
    try:
        return SCHEDULERS[name]
    except KeyError:
        raise DistsimError(f"unknown scheduler {name!r}{suggest(name, list(SCHEDULERS))}") from None


def _naming_the_job(estimate: Estimate) -> Estimate:
    """`estimate`, its planner's refusals (too many ESTs or GPUs to plan) naming the job."""
    from distsim.elastic.planner import ElasticPlanError

    def named(job: Job, counts: Mapping[str, int]) -> tuple[float, dict[str, int]]:
        try:
            return estimate(job, counts)
        except ElasticPlanError as exc:
            raise TraceError(f"job {job.job_id}: {exc}") from None

    return named


def _check(jobs: Sequence[Job], gpus: Mapping[str, int], scheduler: Scheduler) -> None:
    if not jobs:
        raise TraceError("the trace has no job")
    seen: set[str] = set()
    for job in jobs:
        if job.job_id in seen:
            raise TraceError(f"the trace repeats job_id {job.job_id!r}")
        seen.add(job.job_id)
    for job in jobs:
        usable = [t for t, c in job.capabilities.items() if c > 0 and gpus.get(t, 0) > 0]
        if not usable:
            raise TraceError(f"job {job.job_id} can use none of the cluster's GPU types ({', '.join(gpus)})")
        if scheduler.gang and job.gpu_type is not None and gpus.get(job.gpu_type, 0) < job.gpus:
            raise TraceError(f"job {job.job_id} asks for {job.gpus} {job.gpu_type} GPUs; the cluster has "
                             f"{gpus.get(job.gpu_type, 0)}")  # fmt: skip
        if scheduler.gang and max(gpus[t] for t in usable) < job.gpus:
            raise TraceError(f"job {job.job_id} asks for a gang of {job.gpus} GPUs, more than any one type has "
                             f"({', '.join(f'{t}:{gpus[t]}' for t in usable)})")  # fmt: skip


def simulate_cluster(jobs: Sequence[Job], gpus: Mapping[str, int], scheduler: str = "easyscale",
                     estimate: str | Estimate = "planner", round_s: float = 60.0,
                     capability: Capability | None = None, max_jobs: int | None = DEFAULT_MAX_JOBS,
                     progress: Progress | None = None) -> ClusterSimResult:  # fmt: skip
    """Run `jobs` on a cluster of `gpus` (type -> count) under the named scheduler; see the module docstring.

    `capability(job)`, when given, replaces each job's capabilities (C_i per GPU type) before the run, e.g. with the
    simulator's mini-batches/s for its model on each GPU type instead of the trace's figures. More than `max_jobs`
    jobs (None: no limit) is refused (:class:`~distsim.elastic.jobs.TraceTooLarge`) before anything runs.
    `progress(done, total)`, if given, is called as jobs finish."""
    policy = get_scheduler(scheduler)
    if max_jobs is not None and len(jobs) > max_jobs:
        raise too_many_jobs("the trace", len(jobs), max_jobs)
    if not (isinstance(round_s, int | float) and math.isfinite(round_s) and round_s > 0):
        raise DistsimError(f"round_s (--round-s) must be a finite number of seconds > 0, got {round_s!r}")
    if capability is not None:
        jobs = [replace(j, capabilities=dict(capability(j))) for j in jobs]
    est = _naming_the_job(ESTIMATES[estimate]() if isinstance(estimate, str) else estimate)
    gpus = {t: n for t, n in gpus.items() if n > 0}
    _check(jobs, gpus, policy)
    order = sorted(jobs, key=lambda j: j.arrival_s)
    res = ClusterSimResult(scheduler, dict(gpus), {j.job_id: j.arrival_s for j in order}, {}, {})
    active: dict[str, Job] = {}
    alloc: dict[str, dict[str, int]] = {}
    remaining: dict[str, float] = {}
    thr: dict[str, float] = {}
    nxt, t, next_round = 0, order[0].arrival_s, math.inf
    while nxt < len(order) or active:
        t_arrival = order[nxt].arrival_s if nxt < len(order) else math.inf
        t_done = min((t + remaining[j] / r for j, r in thr.items() if r > 0), default=math.inf)
        t_next = min(t_arrival, t_done, next_round)
        if not math.isfinite(t_next):
            raise TraceError(f"jobs {', '.join(sorted(active)[:3])} can never start under {scheduler}")
        # due: predicted to finish by t_next; a job's last mini-batches may round to a residue, and late in a long
        # trace a float clock cannot step past it, so a due job finishes now whatever is left
        due = [j for j, r in thr.items() if r > 0 and t + remaining[j] / r <= t_next]
        for j, r in thr.items():
            step = min(r * (t_next - t), remaining[j])
            remaining[j] -= step
            res.processed[j] += step
        t = t_next
        done = [*due, *(j for j, r in thr.items() if r > 0 and j not in due and remaining[j] <= 1e-9 * max(r, 1.0))]
        for j in done:
            res.processed[j] += remaining.pop(j)
            res.finish_s[j] = t
            del active[j], alloc[j], thr[j]
        if progress is not None and done:
            progress(len(res.finish_s), len(order))
        while nxt < len(order) and order[nxt].arrival_s <= t:
            job = order[nxt]
            active[job.job_id], remaining[job.job_id], res.processed[job.job_id] = job, job.work, 0.0
            nxt += 1
        free = dict(gpus)
        for counts in alloc.values():
            for g, n in counts.items():
                free[g] -= n
        new, grants = policy.schedule(list(active.values()), alloc, free, est)
        for j, counts in new.items():
            if counts and counts != alloc.get(j):
                alloc[j] = counts
                thr[j] = est(active[j], counts)[0]
        res.grants.extend((t, g) for g in grants)
        for g in gpus:
            res.peak[g] = max(res.peak.get(g, 0), sum(c.get(g, 0) for c in alloc.values()))
        in_use = sum(sum(c.values()) for c in alloc.values())
        if not res.allocated or res.allocated[-1][1] != in_use:
            res.allocated.append((t, in_use))
        next_round = t + round_s if grants and policy.elastic and active else math.inf
    return res
