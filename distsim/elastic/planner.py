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

Pure: no simulator, no I/O; capabilities come from :mod:`distsim.elastic.capability` or the user.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from distsim.errors import DistsimError

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
def _check(max_workers: int, capabilities: Mapping[str, float], available: Mapping[str, int]) -> None:
    if not isinstance(max_workers, int) or max_workers < 1:
        raise ElasticPlanError(f"maxP (--max-workers) must be an integer >= 1, got {max_workers!r}")
    for t, n in available.items():
        if t not in capabilities:
            raise ElasticPlanError(f"GPU type {t!r} has no capability (known: {', '.join(sorted(capabilities))})")
        if not isinstance(n, int) or n < 0:
            raise ElasticPlanError(f"available {t} GPUs must be an integer >= 0, got {n!r}")
        c = capabilities[t]
        if not (isinstance(c, (int, float)) and math.isfinite(c) and c > 0):
            raise ElasticPlanError(f"capability of {t} must be a positive number of mini-batches/s, got {c!r}")


def _minimal_counts(types: list[str], per_gpu: list[int], limits: list[int], need: int) -> Iterator[tuple[int, ...]]:
    """Every (N_1..N_k), N_i <= limits[i], with sum N_i A_i >= need from which no single GPU can be removed."""
    k = len(types)
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
    ranked by :func:`rank_key` in the order of `available`; no waste cut."""
    _check(max_workers, capabilities, available)
    types = [t for t, n in available.items() if n > 0]
    if not types:
        return []
    caps = [float(capabilities[t]) for t in types]
    limits = [available[t] for t in types]
    steps = sorted({(a / c, a, j) for j, c in enumerate(caps) for a in range(1, max_workers + 1)})
    seen: set[tuple[int, ...]] = set()
    plans: list[ElasticPlan] = []
    for f, a, j in steps:
        per_gpu = [a if i == j else min(max_workers, math.floor(f * c * (1 + _EPS))) for i, c in enumerate(caps)]
        for counts in _minimal_counts(types, per_gpu, limits, max_workers):
            if counts in seen:
                continue
            seen.add(counts)
            plans.append(make_plan(dict(zip(types, counts, strict=True)), dict(zip(types, per_gpu, strict=True)),
                                   capabilities, max_workers))  # fmt: skip
    order = {t: i for i, t in enumerate(types)}
    return sorted(plans, key=lambda p: rank_key(p, order))


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
