"""Contiguous partition of a layer sequence into pipeline stages.

``balanced_partition`` minimises the largest stage weight (the pipeline's bottleneck) exactly: the optimum is the
smallest contiguous sum of weights (a *candidate*, ``prefix[j] - prefix[i]`` in floating point) for which the
greedy feasibility test packs the layers into k stages. Among optimal partitions it fills stages from the front,
keeping at least one layer for every later stage.

The candidates are never listed (there are n(n+1)/2 of them): bisection on the value, with the greedy test, narrows
an interval (lo, hi] with lo infeasible and hi feasible until at most 2n candidates lie in it, counting them with two
pointers in O(n) (a contiguous sum grows with its end and shrinks with its start, also in floating point); those few
are then listed, sorted and searched with the greedy test. Each step is O(n); the bisection takes some 30-60 steps
for real weights, so a call is O(n log(range)) instead of the O(n^2 log n) of sorting every candidate.
"""

from __future__ import annotations

import math
from itertools import accumulate

from distsim.core.errors import StrategyError


def _fits(weights: list[float], k: int, cap: float) -> bool:
    """Whether greedy packing (a stage takes layers while its running sum stays <= cap) needs at most k stages.

    Monotone in cap, also in floating point: a running sum of non-negative weights only grows."""
    groups, current = 1, 0.0
    for w in weights:
        if w > cap:
            return False
        if current + w > cap:
            groups += 1
            current = w
            if groups > k:
                return False
        else:
            current += w
    return True


def _count_at_most(prefix: list[float], x: float) -> int:
    """Number of candidates prefix[j] - prefix[i] (i < j) that are <= x (two pointers, O(n))."""
    n, j, count = len(prefix) - 1, 0, 0
    for i in range(n):
        j = max(j, i)
        while j < n and prefix[j + 1] - prefix[i] <= x:
            j += 1
        count += j - i
    return count


def _candidates_in(prefix: list[float], lo: float, hi: float) -> list[float]:
    """The distinct candidates in (lo, hi], sorted (two pointers: both ends of each start's range only advance)."""
    n, a, b, out = len(prefix) - 1, 0, 0, set()
    for i in range(n):
        a, b = max(a, i), max(b, i)
        while a < n and prefix[a + 1] - prefix[i] <= lo:
            a += 1
        while b < n and prefix[b + 1] - prefix[i] <= hi:
            b += 1
        out.update(prefix[j] - prefix[i] for j in range(a + 1, b + 1))
    return sorted(out)


def _smallest_above(prefix: list[float], x: float) -> float:
    """The smallest candidate > x (one exists: x < the total)."""
    n, j, best = len(prefix) - 1, 0, math.inf
    for i in range(n):
        j = max(j, i + 1)
        while j <= n and prefix[j] - prefix[i] <= x:
            j += 1
        if j <= n:
            best = min(best, prefix[j] - prefix[i])
    return best


def _bottleneck(weights: list[float], k: int) -> float:
    """The smallest candidate for which greedy packing fits k stages."""
    prefix = [0.0, *accumulate(weights)]
    n = len(weights)
    lo, hi = math.nextafter(max(weights), -math.inf), prefix[n]  # lo: infeasible (below a weight); hi: one stage
    below_lo, below_hi = _count_at_most(prefix, lo), n * (n + 1) // 2
    while below_hi - below_lo > 2 * n:
        mid = lo + (hi - lo) / 2
        if not lo < mid < hi:  # adjacent floats: hi is the only value in (lo, hi], so a candidate, and feasible
            return hi
        if _fits(weights, k, mid):
            hi, below_hi = mid, _count_at_most(prefix, mid)
        else:
            lo, below_lo = mid, _count_at_most(prefix, mid)
    # every candidate <= lo is infeasible; hi is feasible but need not be a candidate
    caps = _candidates_in(prefix, lo, hi)
    a, b = 0, len(caps)
    while a < b:  # the first feasible of the few candidates in (lo, hi]
        mid_index = (a + b) // 2
        if _fits(weights, k, caps[mid_index]):
            b = mid_index
        else:
            a = mid_index + 1
    return caps[a] if a < len(caps) else _smallest_above(prefix, hi)  # the latter is feasible, as hi is


def balanced_partition(weights: list[float], k: int) -> tuple[int, ...]:
    """Layer counts of k contiguous non-empty stages minimising the maximum stage weight."""
    n = len(weights)
    if not 1 <= k <= n:
        raise StrategyError(f"cannot split {n} layers into {k} stages")
    cap = _bottleneck(weights, k)
    counts, current, size = [], 0.0, 0
    for i, w in enumerate(weights):
        remaining_layers = n - i
        remaining_stages = k - len(counts)
        must_close = size > 0 and (current + w > cap or remaining_layers < remaining_stages)
        if must_close:
            counts.append(size)
            current, size = 0.0, 0
        current += w
        size += 1
    counts.append(size)
    assert len(counts) == k and sum(counts) == n, (counts, k, n)
    return tuple(counts)


def uniform_partition(n: int, k: int) -> tuple[int, ...]:
    """Layer counts as equal as possible, the larger stages first."""
    if not 1 <= k <= n:
        raise StrategyError(f"cannot split {n} layers into {k} stages")
    base, extra = divmod(n, k)
    return tuple(base + (1 if i < extra else 0) for i in range(k))


def ranges(counts: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """[start, end) layer index ranges of consecutive stages."""
    out, start = [], 0
    for c in counts:
        out.append((start, start + c))
        start += c
    return tuple(out)


def rank_layers(stage_ranges: tuple[tuple[int, int], ...], pp: int, rank: int) -> list[int]:
    """Layer indices a pipeline rank holds: its stages rank, rank + pp, ... (several when interleaved)."""
    return [i for vs in range(rank, len(stage_ranges), pp) for i in range(*stage_ranges[vs])]
