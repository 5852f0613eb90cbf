"""Contiguous partition of a layer sequence into pipeline stages.

``balanced_partition`` minimises the largest stage weight (the pipeline's bottleneck) exactly: it searches the
candidate bottlenecks (all contiguous sums) with a greedy feasibility test, O(n log n) tests of O(n) each. Among
optimal partitions it fills stages from the front, keeping at least one layer for every later stage.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate

from distsim.errors import StrategyError


def _fits(weights: list[float], k: int, cap: float) -> bool:
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


def balanced_partition(weights: list[float], k: int) -> tuple[int, ...]:
    """Layer counts of k contiguous non-empty stages minimising the maximum stage weight."""
    n = len(weights)
    if not 1 <= k <= n:
        raise StrategyError(f"cannot split {n} layers into {k} stages")
    prefix = [0.0, *accumulate(weights)]
    candidates = sorted({prefix[j] - prefix[i] for i in range(n) for j in range(i + 1, n + 1)})
    lo, hi = bisect_left(candidates, max(weights)), len(candidates) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _fits(weights, k, candidates[mid]):
            hi = mid
        else:
            lo = mid + 1
    cap = candidates[lo]
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
