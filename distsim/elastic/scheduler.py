"""Inter-job schedulers over a heterogeneous GPU cluster: EasyScale's proposal/grant loop and a YARN-CS baseline.

Every scheduler has one method, ``schedule(jobs, alloc, free, estimate)``: given the active jobs in FIFO (arrival)
order, each job's current GPUs, the free GPUs per type and a throughput estimate, it returns the new allocation and
the grants it made, in order. Schedulers are a registry (:data:`SCHEDULERS`); the CLI's choices come from it.

**EasyScale** (Sec. 3.4; ALGORITHMS.md 5.3), one scheduling round:

1. *Initial proposals, FIFO.* A job without GPUs proposes the smallest plan that starts it, one GPU (the paper sets
   the minimum to 0 GPUs; its maxP ESTs time-slice on that GPU). It gets one GPU of the fastest type with a free GPU.
2. *Increments.* Every running job not granted in step 1 proposes scale-outs that add ``d`` GPUs of one type
   (Role 2): at most doubling (``d <= n``), never beyond maxP GPUs, and only where the planner uses every added GPU.
   Each is scored ``(thr_new / thr_cur - 1) / d``, the speedup per added GPU (the code's ``inc_perf`` minus 1).
3. *Grants.* Proposals are taken best score first, ties to the one with more GPUs (then FIFO); a proposal is granted
   while its type has ``d`` free GPUs, at most one grant per job per round.

``easyscale-homo`` is the paper's EasyScale_homo: a job's plans are constrained to the GPU type it started on.

**YARN-CS** (Apache YARN's capacity scheduler as Philly ran it): FIFO with gang scheduling; the head job gets its
requested number of GPUs, all of one type (the job's ``gpu_type`` if the trace pins one, else the fastest type
with that many free), or waits, and so does every job
behind it (head-of-line blocking). A job keeps its gang until it finishes.

A throughput estimate ``estimate(job, counts) -> (mini-batches/s, counts used)`` is EasyScale's Eq. 1 planner
(:func:`planner_estimate` makes one) or, for hand-checkable cases, :func:`linear_estimate`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from distsim.elastic.jobs import Job

Counts = dict[str, int]
Estimate = Callable[[Job, Mapping[str, int]], tuple[float, Counts]]
Key = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Grant:
    """GPUs given to a job in one round: ``added`` GPUs of ``gpu_type`` (score None: an initial or gang grant)."""

    job_id: str
    gpu_type: str
    added: int
    score: float | None = None


def _key(counts: Mapping[str, int]) -> Key:
    return tuple(sorted((t, n) for t, n in counts.items() if n > 0))


def linear_estimate(job: Job, counts: Mapping[str, int]) -> tuple[float, Counts]:
    """Sum of N_i C_i over the GPUs given, up to maxP GPUs (perfect balance): a hand-checkable stand-in for Eq. 1."""
    used = dict(_key(counts))
    if sum(used.values()) > job.max_workers:
        return 0.0, used
    return sum(n * job.capabilities.get(t, 0.0) for t, n in used.items()), used


def _planned(max_workers: int, capabilities: Mapping[str, float], counts: Key) -> tuple[float, Key]:
    from distsim.elastic.planner import plan_elastic

    available = {t: n for t, n in counts if capabilities.get(t, 0) > 0}
    if not available:
        return 0.0, ()
    plans = plan_elastic(max_workers, {t: c for t, c in capabilities.items() if c > 0}, available)
    if not plans:
        return 0.0, ()
    best = max(plans, key=lambda p: (p.throughput, -p.gpus))
    return best.throughput, _key(best.counts)


def planner_estimate() -> Estimate:
    """EasyScale's intra-job planner (Eqs. 1a-1d): the best plan's throughput on at most the given GPUs, and its
    GPUs; memoised per (maxP, capabilities, GPUs) for the life of the returned function (one simulation)."""
    cache: dict[tuple[int, tuple[tuple[str, float], ...], Key], tuple[float, Key]] = {}

    def estimate(job: Job, counts: Mapping[str, int]) -> tuple[float, Counts]:
        key = (job.max_workers, tuple(sorted(job.capabilities.items())), _key(counts))
        if key not in cache:
            cache[key] = _planned(job.max_workers, job.capabilities, key[2])
        thr, used = cache[key]
        return thr, dict(used)

    return estimate


ESTIMATES: dict[str, Callable[[], Estimate]] = {"planner": planner_estimate, "linear": lambda: linear_estimate}
"""Throughput estimates by name; each entry makes a fresh estimate (with its own memo) for one simulation."""


def _fastest(job: Job, free: Mapping[str, int], need: int) -> str | None:
    """The type with the highest capability for `job` that has `need` free GPUs (ties by name)."""
    fits = [t for t, c in job.capabilities.items() if c > 0 and free.get(t, 0) >= need]
    return max(fits, key=lambda t: (job.capabilities[t], t)) if fits else None


@dataclass(frozen=True)
class EasyScale:
    """EasyScale's inter-job scheduler (module docstring); ``hetero=False`` keeps each job on one GPU type."""

    hetero: bool = True
    elastic: bool = True
    gang: bool = False

    def schedule(self, jobs: Sequence[Job], alloc: Mapping[str, Mapping[str, int]], free: Mapping[str, int],
                 estimate: Estimate) -> tuple[dict[str, Counts], list[Grant]]:  # fmt: skip
        new = {j: dict(c) for j, c in alloc.items()}
        left, grants, granted = dict(free), [], set()
        for job in jobs:  # 1. initial proposals, FIFO
            if not any(left.values()):
                break  # no GPU left to start anyone: the rest of the queue waits (saves a scan of a long queue)
            if new.get(job.job_id):
                continue
            t = _fastest(job, left, 1)
            if t is not None:
                new[job.job_id] = {t: 1}
                left[t] -= 1
                granted.add(job.job_id)
                grants.append(Grant(job.job_id, t, 1))
        proposals = []
        for order, job in enumerate(jobs):  # 2. increments
            cur = new.get(job.job_id)
            if not cur or job.job_id in granted:
                continue
            n = sum(cur.values())
            thr_cur = estimate(job, cur)[0]
            room = min(n, job.max_workers - n)
            types = list(cur) if not self.hetero else [t for t, c in job.capabilities.items() if c > 0]
            for t in types:
                for d in range(1, min(room, left.get(t, 0)) + 1):
                    grown = dict(cur)
                    grown[t] = grown.get(t, 0) + d
                    thr_new, used = estimate(job, grown)
                    if used != dict(_key(grown)) or thr_cur <= 0:
                        continue  # the planner leaves an added GPU idle: not worth proposing
                    score = round((thr_new / thr_cur - 1.0) / d, 12)
                    if score > 0:
                        proposals.append((-score, -d, order, t, job))
        proposals.sort(key=lambda p: p[:4])
        for neg_score, neg_d, _, t, job in proposals:  # 3. grants
            d = -neg_d
            if job.job_id in granted or left.get(t, 0) < d:
                continue
            new[job.job_id][t] = new[job.job_id].get(t, 0) + d
            left[t] -= d
            granted.add(job.job_id)
            grants.append(Grant(job.job_id, t, d, -neg_score))
        return new, grants


@dataclass(frozen=True)
class YarnCS:
    """YARN's capacity scheduler: FIFO gang scheduling on one GPU type, head-of-line blocking (module docstring)."""

    hetero: bool = False
    elastic: bool = False
    gang: bool = True

    def schedule(self, jobs: Sequence[Job], alloc: Mapping[str, Mapping[str, int]], free: Mapping[str, int],
                 estimate: Estimate) -> tuple[dict[str, Counts], list[Grant]]:  # fmt: skip
        new = {j: dict(c) for j, c in alloc.items()}
        left, grants = dict(free), []
        for job in jobs:
            if new.get(job.job_id):
                continue
            t = _fastest(job, left, job.gpus) if job.gpu_type is None else job.gpu_type
            if t is None or left.get(t, 0) < job.gpus:
                break  # the head of the queue waits, and everything behind it
            new[job.job_id] = {t: job.gpus}
            left[t] -= job.gpus
            grants.append(Grant(job.job_id, t, job.gpus))
        return new, grants


Scheduler = EasyScale | YarnCS

SCHEDULERS: dict[str, Scheduler] = {
    "easyscale": EasyScale(hetero=True),
    "easyscale-homo": EasyScale(hetero=False),
    "yarn-cs": YarnCS(),
}
"""Inter-job schedulers by name; a new policy is one entry with the same ``schedule`` method."""
