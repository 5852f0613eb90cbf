"""balanced_partition returns exactly what the original O(n^2 log n) search over every contiguous sum returned.

The reference below is that original implementation, kept verbatim: it lists and sorts every candidate bottleneck
(every contiguous sum, computed as a difference of prefix sums) and binary-searches them with the greedy test.
Floating-point ties matter (0.1 + 0.2 != 0.3), so equal and decimal weights are compared as well as random ones.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from itertools import accumulate, pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distsim.core.errors import StrategyError
from distsim.core.partition import _fits, balanced_partition


def reference_partition(weights: list[float], k: int) -> tuple[int, ...]:
    n = len(weights)
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
        must_close = size > 0 and (current + w > cap or n - i < k - len(counts))
        if must_close:
            counts.append(size)
            current, size = 0.0, 0
        current += w
        size += 1
    counts.append(size)
    return tuple(counts)


def _cases() -> list[tuple[list[float], int]]:
    rng = random.Random(7)
    cases = []
    for n in (1, 2, 3, 5, 8, 13, 50, 200, 400):
        for k in sorted({1, 2, 3, max(1, n // 2), n}):
            if k > n:
                continue
            cases.append(([rng.uniform(0.0, 1.0) for _ in range(n)], k))  # random
            cases.append(([rng.choice([0.1, 0.2, 0.3, 0.7]) for _ in range(n)], k))  # decimal ties
            cases.append(([0.1] * n, k))  # equal weights: sums differ in their last bits
            cases.append(([1.0] * n, k))  # equal weights: exact integer ties
            cases.append(([1 / 3] * n, k))
            cases.append(([0.0] * n, k))  # all zero
            cases.append(([rng.choice([0.0, 1e-9, 5.0, 1e6]) for _ in range(n)], k))  # zeros and wide range
            cases.append(([rng.lognormvariate(-7, 2) for _ in range(n)], k))  # layer times in seconds
    return cases


@pytest.mark.parametrize(("weights", "k"), _cases())
def test_matches_the_reference(weights: list[float], k: int) -> None:
    assert balanced_partition(weights, k) == reference_partition(weights, k)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.floats(0.0, 10.0, allow_nan=False),
            st.sampled_from([0.0, 0.1, 0.2, 0.3, 1.0, 1 / 3, 1e-300, 2.5e-7]),
        ),
        min_size=1,
        max_size=60,
    ),
    st.data(),
)
def test_matches_the_reference_hypothesis(weights: list[float], data: st.DataObject) -> None:
    k = data.draw(st.integers(1, len(weights)))
    assert balanced_partition(weights, k) == reference_partition(weights, k)


def test_transformer_like_stack_splits_evenly() -> None:
    weights = [3.0] + [1.0] * 48 + [3.0]
    assert balanced_partition(weights, 2) == (25, 25)
    assert sum(balanced_partition(weights, 7)) == 50


def test_large_stack_at_the_layer_limit() -> None:
    """20,000 layers (twice MAX_LAYERS): the reference would sort 200 million candidates; the result is still an
    optimal, front-filled partition (checked against the greedy test at the found bottleneck)."""
    rng = random.Random(1)
    weights = [rng.uniform(0.5, 1.5) for _ in range(20_000)]
    counts = balanced_partition(weights, 16)
    assert len(counts) == 16 and sum(counts) == 20_000 and min(counts) >= 1
    bounds = [0, *accumulate(counts)]
    stage_sums = [sum(weights[a:b]) for a, b in pairwise(bounds)]
    assert max(stage_sums) <= 1.02 * sum(weights) / 16  # within one layer of the ideal


def test_refuses_more_stages_than_layers() -> None:
    with pytest.raises(StrategyError, match="cannot split 3 layers into 4 stages"):
        balanced_partition([1.0, 1.0, 1.0], 4)
