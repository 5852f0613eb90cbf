"""EasyScale's intra-job planner: which GPUs of which types host a job's maxP ESTs, and how many ESTs each.

A job fixes maxP logical data-parallel workers (ESTs); an EasyScale worker owns one GPU and time-slices its ESTs,
so a global step lasts as long as the slowest GPU takes to run its ESTs' mini-batches. For GPU type i with
capability C_i (mini-batches per second of this job on one GPU of that type), N_i GPUs used and A_i ESTs on each
(ALGORITHMS.md 5.2, the paper's Eqs. 1a-1d)::

    nEST       = sum_i N_i A_i >= maxP                              (1a)
    f          = max_{i: N_i > 0} A_i / C_i   seconds per step      (1b)
    waste      = sum_i N_i (C_i - A_i / f) + (nEST - maxP) / f      (1c, with the N_i factor)
    throughput = sum_i N_i C_i - waste = maxP / f                   (1d)

The printed Eq. 1c has no N_i factor; the authors' code sums over every chosen GPU, which is the same as weighting
by N_i, and only that form makes (1d) equal maxP / f (:func:`waste` with ``per_type=True`` gives the printed form).
The (nEST - maxP) / f term is the idle ESTs' share: slots a GPU could run in the step but has no EST for.

Enumeration. The paper tries, for m = 1..maxP, A_i = floor/ceil(m perf_i) (perf_i: C_i over the fastest type's)
and grows GPU multisets by depth-first search until sum A >= maxP. Here the step times tried are every a / C_i
(a = 1..maxP, i a type), which contains every f any mapping can have; at each, a GPU of type i hosts the most ESTs
that fit, A_i = min(maxP, floor(f C_i)), and the GPU multisets are the minimal ones (no GPU can leave with sum A
still >= maxP) within the available counts. A multiset is kept at the first (shortest) step it fits, so each
plan is a GPU multiset at its fastest mapping; this finds the best plan that any N_i <= available, A_i <= maxP can
give. Plans whose normalised waste (waste over sum_i N_i C_i) exceeds the cut (0.30 in the paper) are dropped.

That sweep costs about maxP steps per type; the same plans come from every GPU multiset within the available counts
(at most maxP GPUs) at its shortest step, found by bisection over each type's a (log maxP per multiset), which costs
nothing more for a larger maxP. :func:`enumerate_plans` runs whichever is cheaper (the sets for few GPUs and a large
maxP, the sweep otherwise) and refuses inputs for which both would take long or that have too many plans.

Pure: no simulator, no I/O; capabilities come from :mod:`distsim.elastic.capability` or the user.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from distsim.core.errors import DistsimError

#: The paper's normalised-waste cut: proposals wasting more than this share of their GPUs' capability are dropped.
WASTE_CUT = 0.30

# relative slack for float comparisons of step times (a / C_i computed from different types)
_EPS = 1e-9


class ElasticPlanError(DistsimError, ValueError):
    """Planner input that makes no sense (maxP < 1, a non-positive capability, a type with no capability)."""


@dataclass(frozen=True)
class ElasticPlan:
    """One EST placement: N_i GPUs of type i, A_i ESTs on each, and its Eqs. 1b-1d figures."""

    counts: dict[str, int]  # N_i: GPUs used per GPU type (only types with N_i > 0)
    ests: dict[str, int]  # A_i: ESTs per GPU of that type
    step_s: float  # f = max_i A_i / C_i, seconds per global step (Eq. 1b)
    waste: float  # Eq. 1c with the N_i factor, in mini-batches/s
    throughput: float  # Eq. 1d = maxP / f, mini-batches/s
    normalized_waste: float  # waste / sum_i N_i C_i

    @property
    def gpus(self) -> int:
        return sum(self.counts.values())

    @property
    def est_slots(self) -> int:
        """nEST = sum_i N_i A_i (Eq. 1a); the slots beyond maxP are idle."""
        return sum(n * self.ests[t] for t, n in self.counts.items())

    def label(self) -> str:
        """'V100:2x3,T4:1x2': N_i x A_i per type, in the plan's type order."""
        return ",".join(f"{t}:{n}x{self.ests[t]}" for t, n in self.counts.items())

    def to_dict(self) -> dict[str, object]:
        return {
            "counts": dict(self.counts),
            "ests": dict(self.ests),
            "gpus": self.gpus,
            "est_slots": self.est_slots,
            "step_s": self.step_s,
            "throughput": self.throughput,
            "waste": self.waste,
            "normalized_waste": self.normalized_waste,
        }


# ------------------------------------------------------------------------------------------------ the equations
def step_time(counts: Mapping[str, int], ests: Mapping[str, int], capabilities: Mapping[str, float]) -> float:
    """Eq. 1b: f = max over the types used of A_i / C_i."""
    return max(ests[t] / capabilities[t] for t, n in counts.items() if n > 0)


def waste(counts: Mapping[str, int], ests: Mapping[str, int], capabilities: Mapping[str, float], max_workers: int,
          per_type: bool = False) -> float:  # fmt: skip
    """Eq. 1c: sum_i N_i (C_i - A_i / f) + (nEST - maxP) / f. With ``per_type`` the paper's printed form, which
    counts each type once (no N_i factor); the two agree when every N_i <= 1."""
    f = step_time(counts, ests, capabilities)
    n_est = sum(n * ests[t] for t, n in counts.items())
    used = [(t, n) for t, n in counts.items() if n > 0]
    busy = sum((1 if per_type else n) * (capabilities[t] - ests[t] / f) for t, n in used)
    return busy + (n_est - max_workers) / f


def make_plan(counts: Mapping[str, int], ests: Mapping[str, int], capabilities: Mapping[str, float],
              max_workers: int) -> ElasticPlan:  # fmt: skip
    """The plan for given N_i and A_i (types with N_i = 0 left out), with its Eqs. 1b-1d figures."""
    used = {t: n for t, n in counts.items() if n > 0}
    if not used:
        raise ElasticPlanError("a plan needs at least one GPU")
    a = {t: ests[t] for t in used}
    if any(v < 1 for v in a.values()):
        raise ElasticPlanError(f"every GPU of a plan hosts at least one EST, got {a}")
    if sum(n * a[t] for t, n in used.items()) < max_workers:
        raise ElasticPlanError(f"{used} x {a} hosts fewer than maxP = {max_workers} ESTs")
    f = step_time(used, a, capabilities)
    w = waste(used, a, capabilities, max_workers)
    capacity = sum(n * capabilities[t] for t, n in used.items())
    return ElasticPlan(counts=used, ests=a, step_s=f, waste=w, throughput=max_workers / f,
                       normalized_waste=w / capacity)  # fmt: skip


def rank_key(plan: ElasticPlan, order: Mapping[str, int]) -> tuple:
    """Throughput (desc, to 9 significant digits), then fewer GPUs, then less normalised waste, then the N_i and
    A_i in the given type order (more GPUs of the earlier types first)."""
    types = sorted(order, key=order.__getitem__)
    return (
        -float(f"{plan.throughput:.9g}"),
        plan.gpus,
        round(plan.normalized_waste, 9),
        tuple(-plan.counts.get(t, 0) for t in types),
        tuple(-plan.ests.get(t, 0) for t in types),
    )


# ----------------------------------------------------------------------------------------------- enumeration
#: The most ESTs a job may have: step times are compared with a relative tolerance of 1e-9 (_EPS), which stops
#: resolving one EST beyond 10^9 (and the planner's cost does not grow with maxP: no other reason to stop).
MAX_WORKERS = 10**9


def _check(max_workers: int, capabilities: Mapping[str, float], available: Mapping[str, int]) -> None:
    if not isinstance(max_workers, int) or max_workers < 1:
        raise ElasticPlanError(f"maxP (--max-workers) must be an integer >= 1, got {max_workers!r}")
    if max_workers > MAX_WORKERS:
        raise ElasticPlanError(f"maxP (--max-workers) {max_workers} is over the planner's limit of {MAX_WORKERS:,} "
                               "ESTs (its step times resolve one EST up to there)")  # fmt: skip
    for t, n in available.items():
        if t not in capabilities:
            raise ElasticPlanError(f"GPU type {t!r} has no capability (known: {', '.join(sorted(capabilities))})")
        if not isinstance(n, int) or n < 0:
            raise ElasticPlanError(f"available {t} GPUs must be an integer >= 0, got {n!r}")
        c = capabilities[t]
        if not (isinstance(c, (int, float)) and math.isfinite(c) and c > 0):
            raise ElasticPlanError(f"capability of {t} must be a positive number of mini-batches/s, got {c!r}")


def _minimal_counts(per_gpu: list[int], limits: list[int], need: int) -> Iterator[tuple[int, ...]]:
    """Every (N_1..N_k), N_i <= limits[i], with sum N_i A_i >= need from which no single GPU can be removed."""
    k = len(per_gpu)
    # the most ESTs types i.. can add, to prune
    reach = [0] * (k + 1)
    for i in range(k - 1, -1, -1):
        reach[i] = reach[i + 1] + per_gpu[i] * limits[i]

    def rec(i: int, got: int, prefix: tuple[int, ...], smallest: int) -> Iterator[tuple[int, ...]]:
        if i == k - 1:
            a = per_gpu[i]
            rest = max(0, need - got)
            n = -(-rest // a) if a else (0 if rest == 0 else -1)
            if n < 0 or n > limits[i]:
                return
            low = min(smallest, a) if n else smallest
            if got + n * a - low < need:  # minimal: removing the least-hosting GPU drops below maxP (need >= 1)
                yield (*prefix, n)
            return
        a = per_gpu[i]
        top = limits[i] if a else 0
        for n in range(top + 1):
            total = got + n * a
            if total + reach[i + 1] < need:
                continue
            yield from rec(i + 1, total, (*prefix, n), min(smallest, a) if n else smallest)
            if total >= need:
                break  # more GPUs of this type would be redundant

    yield from rec(0, 0, (), max(per_gpu) + 1 if per_gpu else 1)


def enumerate_plans(max_workers: int, capabilities: Mapping[str, float],
                    available: Mapping[str, int]) -> list[ElasticPlan]:  # fmt: skip
    """Every minimal GPU multiset within `available` that hosts maxP ESTs, at its shortest step (module docstring),
    ranked by :func:`rank_key` in the order of `available`; no waste cut.

    Two exact enumerations of the same plans, whichever costs less (:func:`_cost_us`): the sweep over the step times
    a / C_i (up to maxP steps per type: cheap for small maxP), or every GPU multiset within `available` at its
    shortest step found by bisection (log maxP steps per multiset: cheap for few GPUs, however large maxP). Inputs
    for which both would take over :data:`MAX_PLAN_US`, or that have more than :data:`MAX_PLANS` plans, are refused
    (ElasticPlanError)."""
    _check(max_workers, capabilities, available)
    types = [t for t, n in available.items() if n > 0]
    if not types:
        return []
    caps = [float(capabilities[t]) for t in types]
    limits = [min(available[t], max_workers) for t in types]  # a minimal set never has more than maxP GPUs
    space = _Space(max_workers, caps, limits)
    sweep_us, sets_us = _cost_us(space)
    if min(sweep_us, sets_us) > MAX_PLAN_US:
        raise ElasticPlanError(
            f"planning {max_workers} ESTs on {_gpus(available)} would take about {min(sweep_us, sets_us) / 1e6:,.0f} s "
            f"({space.step_count():,} step times, or {space.set_count():,} GPU sets, to examine), over the planner's "
            f"limit of {MAX_PLAN_US / 1e6:.0f} s: give fewer ESTs (--max-workers) or fewer GPUs (--gpus)"
        )
    found = space.by_sweep() if sweep_us <= sets_us else space.by_set()
    plans: list[ElasticPlan] = []
    for counts, per_gpu in found:
        if len(plans) == MAX_PLANS:
            raise ElasticPlanError(f"{max_workers} ESTs on {_gpus(available)} have more than {MAX_PLANS:,} plans: give "
                                   "fewer GPU types or fewer GPUs of each (--gpus)")  # fmt: skip
        plans.append(make_plan(dict(zip(types, counts, strict=True)), dict(zip(types, per_gpu, strict=True)),
                               capabilities, max_workers))  # fmt: skip
    order = {t: i for i, t in enumerate(types)}
    return sorted(plans, key=lambda p: rank_key(p, order))


#: Plans one enumeration may produce: each costs about 850 bytes and 25 us (measured: 135,709 plans of 24 ESTs on
#: 32 GPUs of each of 8 types, 3.4 s and 114 MB on a 2-core AMD EPYC); 200,000 bound it to about 170 MB and 5 s.
MAX_PLANS = 200_000

#: The enumeration's cost before it starts, from per-unit times measured on a 2-core AMD EPYC: a step of the sweep
#: about 7 us (200,000 ESTs on V100:4,T4:4: 350,001 steps in 2.5 s; more where steps find many plans), a GPU set's
#: bisections about 1 us per (type x type x bit of maxP) (64 ESTs on 32 V100, P100 and T4: 2.26 M such units in
#: 1.1 s; 10^9 ESTs on V100:100,T4:100: 1.22 M in 1.6 s). Inputs whose cheaper enumeration would take longer than
#: this are refused before it starts.
SWEEP_STEP_US = 7.0
SET_UNIT_US = 1.0
MAX_PLAN_US = 20e6


def _gpus(available: Mapping[str, int]) -> str:
    return ",".join(f"{t}:{n}" for t, n in available.items())


class _Space:
    """The step times and GPU multisets of one enumeration (types with GPUs available, their C_i, and how many of
    each a minimal set can use)."""

    def __init__(self, max_workers: int, caps: list[float], limits: list[int]) -> None:
        self.p, self.caps, self.limits = max_workers, caps, limits
        # below first[j] ESTs, a step of type j cannot host maxP ESTs even on every available GPU
        self.first = [self.first_fit(limits, j) for j in range(len(caps))]

    def per_gpu(self, a: int, j: int) -> list[int]:
        """The ESTs each type's GPU hosts at step a / C_j: a on type j, what fits in that step on the others."""
        f = a / self.caps[j]
        return [a if i == j else min(self.p, math.floor(f * c * (1 + _EPS))) for i, c in enumerate(self.caps)]

    def hosts(self, counts: list[int] | tuple[int, ...], a: int, j: int) -> bool:
        return sum(n * e for n, e in zip(counts, self.per_gpu(a, j), strict=True)) >= self.p

    def first_fit(self, counts: list[int] | tuple[int, ...], j: int) -> int | None:
        """The fewest ESTs a of type j whose step a / C_j lets `counts` host maxP ESTs (bisection: hosting only grows
        with a); None if no step of type j does."""
        lo, hi = 1, self.p
        if not self.hosts(counts, hi, j):
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if self.hosts(counts, mid, j):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def step_count(self) -> int:
        """The sweep's steps."""
        return sum(self.p - a + 1 for a in self.first if a is not None)

    def set_count(self) -> int:
        """An upper bound of the GPU sets :meth:`by_set` examines: within the limits, with at most maxP GPUs."""
        k = len(self.limits)
        return min(math.prod(n + 1 for n in self.limits), math.comb(self.p + k, k)) - 1

    def steps(self, j: int) -> Iterator[tuple[float, int, int]]:
        """Type j's step times from its first fit on: (a / C_j, a, j), increasing."""
        start = self.first[j]
        for a in range(start if start is not None else self.p + 1, self.p + 1):
            yield a / self.caps[j], a, j

    def by_sweep(self) -> Iterator[tuple[tuple[int, ...], list[int]]]:
        """The step times in increasing order (every a / C_i from which every available GPU together hosts maxP), the
        minimal sets at each, every set at the first step it appears in."""
        runs = [self.steps(j) for j in range(len(self.caps))]
        seen: set[tuple[int, ...]] = set()
        for _f, a, j in heapq.merge(*runs):
            per_gpu = self.per_gpu(a, j)
            for counts in _minimal_counts(per_gpu, self.limits, self.p):
                if counts not in seen:
                    seen.add(counts)
                    yield counts, per_gpu

    def by_set(self) -> Iterator[tuple[tuple[int, ...], list[int]]]:
        """Every GPU multiset within the limits (at most maxP GPUs) at its shortest step (the first of the sweep's
        steps at which it hosts maxP ESTs), if it is minimal there."""
        for counts in _bounded_counts(self.limits, self.p):
            shortest = None
            for j, c in enumerate(self.caps):
                a = self.first_fit(counts, j)
                if a is not None and (shortest is None or (a / c, a, j) < shortest):
                    shortest = (a / c, a, j)
            if shortest is None:
                continue
            per_gpu = self.per_gpu(shortest[1], shortest[2])
            used = [e for n, e in zip(counts, per_gpu, strict=True) if n]
            if min(used) >= 1 and sum(n * e for n, e in zip(counts, per_gpu, strict=True)) - min(used) < self.p:
                yield counts, per_gpu


def _bounded_counts(limits: list[int], most: int) -> Iterator[tuple[int, ...]]:
    """Every (N_1..N_k), N_i <= limits[i], with 1 <= sum N_i <= most."""

    def rec(i: int, left: int, prefix: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        if i == len(limits):
            if left < most:
                yield prefix
            return
        for n in range(min(limits[i], left) + 1):
            yield from rec(i + 1, left - n, (*prefix, n))

    yield from rec(0, most, ())


def _cost_us(space: _Space) -> tuple[float, float]:
    """The estimated microseconds of each enumeration: the sweep's steps, and the GPU sets' bisections."""
    k = len(space.limits)
    return (space.step_count() * SWEEP_STEP_US,
            space.set_count() * k * k * max(1, space.p.bit_length()) * SET_UNIT_US)  # fmt: skip


def cut_plans(plans: list[ElasticPlan], waste_cut: float = WASTE_CUT) -> list[ElasticPlan]:
    """The plans whose normalised waste is at most `waste_cut` (the paper's 0.30), in their order."""
    if not (0 <= waste_cut <= 1):
        raise ElasticPlanError(f"the waste cut is a fraction in [0, 1], got {waste_cut}")
    return [p for p in plans if p.normalized_waste <= waste_cut + _EPS]


def plan_elastic(max_workers: int, capabilities: Mapping[str, float], available: Mapping[str, int],
                 waste_cut: float = WASTE_CUT) -> list[ElasticPlan]:  # fmt: skip
    """Every plan with sum N_i A_i >= maxP within `available`, waste cut applied, ranked by throughput (desc),
    ties by fewer GPUs, then a deterministic order (:func:`rank_key`).

    `capabilities`: C_i, mini-batches per second of this job on one GPU of type i; `available`: GPUs free per type.
    Each plan is a minimal GPU multiset (no GPU could leave) at its shortest step, A_i = the ESTs that fit in it."""
    return cut_plans(enumerate_plans(max_workers, capabilities, available), waste_cut)
