"""MG-WFBP's merged-gradient timeline model and its merge planners (Shi et al., TPDS; ALGORITHMS.md section 2).

Data-parallel S-SGD all-reduces each layer's gradients as soon as its backward is done (WFBP), on one FIFO
communication channel; every all-reduce costs T_ar(M) = a + b M (Eq. 10), so merging the gradients of consecutive
layers into one message saves start-ups (Eq. 11) at the price of waiting for the lower layer's backward. This module
is pure logic (no torch, no files):

* :func:`timeline` evaluates Eqs. 6-8 for any merge pattern (:func:`wfbp`: none; :func:`sync_easgd`: everything in
  one message, Eq. 9; :func:`naive_s`: no overlap at all, Eq. 3);
* :func:`greedy` is the paper's Algorithm 1 (the authors' ``_generate_groups_mgwfbp``) exactly as ALGORITHMS.md 2.3
  specifies it: backward order, the merge rule of Lemma 1 / Eq. 36 with a strict inequality, and a recompute of
  every tau_c after each merge;
* :func:`optimal` is the exact O(L^2) DP of ALGORITHMS.md 2.3 and :func:`brute_force` tries all 2^(L-1) patterns.
  They exist because the paper's optimality claim (Theorem 1) is false: the greedy is strictly worse on a sizeable
  fraction of small random instances (see ``tests/unit/test_mgwfbp.py`` for the verified counterexample);
* :func:`allreduce_ab` gives (a, b) from Table II of the paper for four all-reduce algorithms (the registered ones
  with a linear model, :data:`distsim.core.collectives.LINEAR_ALGORITHMS`).

Conventions: layers 1..L are stored 0-based (index 0 = layer 1, the input side); backward runs from layer L down to
layer 1, so "the previous layer" of layer l in backward order is l-1. A merge pattern is a tuple of contiguous groups
``(lo, hi)`` (0-based, half-open) listed highest first; each group is all-reduced as one message of
sum(p[lo:hi]) bytes once its lowest layer ``lo`` has finished its backward.

Zero-byte layers (p = 0, e.g. activations or pooling): their t_c is 0 and a group with no bytes sends no message
(t_c = 0, not a), so a zero-byte layer never starts an all-reduce, and merging one into a neighbour changes no time.
The paper's model has no such layers (the authors' "layers" are parameter tensors, and the backward time of a layer
without parameters falls into the gap before the next gradient), and its merge rule assumes the layer merged into
pays its own start-up a; merging a message into a zero-byte layer saves nothing and only delays it. So
:func:`greedy` runs Algorithm 1 over the layers with bytes, reading "layer l-1" as the next layer below l that has
bytes, and attaches each zero-byte layer to the group below it (zero-byte layers under the lowest layer with bytes
form one empty group). :func:`optimal` and :func:`brute_force` need no such rule: they price every pattern.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from distsim.core.collectives import LINEAR_ALGORITHMS
from distsim.core.errors import DistsimError

Groups = tuple[tuple[int, int], ...]
"""Contiguous layer ranges [lo, hi) (0-based), highest first; see the module docstring."""

BRUTE_FORCE_MAX_LAYERS = 20
""":func:`brute_force` enumerates 2^(L-1) patterns; beyond this many layers use :func:`optimal`."""

ALLREDUCE_ALGORITHMS = LINEAR_ALGORITHMS
"""The all-reduce algorithms :func:`allreduce_ab` models, read from the registry of
:mod:`distsim.core.collectives`: the rows of the paper's Table II (ALGORITHMS.md 2.4) and any registered since."""


class MergeError(DistsimError, ValueError):
    """An invalid merge problem, merge pattern or all-reduce choice."""


def _finite_nonneg(name: str, value: float) -> float:
    """`value` as a float, or MergeError if it is negative, NaN or infinite (all times and sizes here are)."""
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise MergeError(f"{name} must be finite and >= 0, got {value!r}")
    return v


@dataclass(frozen=True)
class MergeProblem:
    """One iteration of data-parallel S-SGD as MG-WFBP models it (ALGORITHMS.md 2.1).

    Layers 1..L are tuples indexed 0..L-1 (index 0 = layer 1, the input side; backward runs from L down to 1).
    ``t_f`` is everything before the backward of layer L (the forward pass); ``t_b[i]`` the backward time of layer
    i+1; ``p[i]`` its gradient bytes (0 = no parameters, hence no communication); an all-reduce of M bytes takes
    ``a + b * M`` seconds (Eq. 10). Merging only pays off when a > 0, but a = 0 is a valid (degenerate) problem.
    Sequences are stored as tuples of floats so that problems are hashable and immutable.
    """

    t_f: float
    t_b: tuple[float, ...]
    p: tuple[float, ...]
    a: float
    b: float

    def __post_init__(self) -> None:
        t_b = tuple(_finite_nonneg(f"t_b[{i}]", x) for i, x in enumerate(self.t_b))
        p = tuple(_finite_nonneg(f"p[{i}]", x) for i, x in enumerate(self.p))
        if not t_b:
            raise MergeError("a merge problem needs at least one layer")
        if len(t_b) != len(p):
            raise MergeError(f"t_b has {len(t_b)} layers but p has {len(p)}")
        object.__setattr__(self, "t_f", _finite_nonneg("t_f", self.t_f))
        object.__setattr__(self, "t_b", t_b)
        object.__setattr__(self, "p", p)
        object.__setattr__(self, "a", _finite_nonneg("a", self.a))
        object.__setattr__(self, "b", _finite_nonneg("b", self.b))

    @property
    def num_layers(self) -> int:
        """L."""
        return len(self.t_b)

    @property
    def compute_s(self) -> float:
        """t_f + sum(t_b): the iteration time with free communication (the numerator of the speedup, Eq. 4)."""
        return self.t_f + sum(self.t_b)

    def t_ar(self, nbytes: float) -> float:
        """All-reduce time of one message (Eq. 10); an empty message is no message, so it costs 0, not a."""
        return self.a + self.b * nbytes if nbytes > 0 else 0.0


@dataclass(frozen=True)
class MergeTimeline:
    """The per-layer timeline (Eqs. 6-8) of one merge pattern.

    ``tau_b[i]``: backward start of layer i+1; ``tau_c[i]``: its communication start on the FIFO channel;
    ``t_c[i]``: its communication time, which is the whole group's message for a group's lowest layer and 0 for the
    layers merged into it (and for zero-byte groups). ``t_iter = tau_c[0] + t_c[0]``.
    """

    problem: MergeProblem
    groups: Groups
    tau_b: tuple[float, ...]
    tau_c: tuple[float, ...]
    t_c: tuple[float, ...]
    t_iter: float

    @property
    def non_overlapped_s(self) -> float:
        """Communication not hidden behind computation: t_iter - t_f - sum(t_b) (ALGORITHMS.md 2.1)."""
        return self.t_iter - self.problem.compute_s

    @property
    def merged_layers(self) -> frozenset[int]:
        """The paper's merged-gradient layers, 1-based: every layer of a group except its lowest."""
        return frozenset(i + 1 for lo, hi in self.groups for i in range(lo + 1, hi))

    @property
    def num_messages(self) -> int:
        """All-reduces per iteration (groups with bytes)."""
        return sum(1 for c in self.t_c if c > 0)


# ------------------------------------------------------------------------------------------------- the timeline
def _backward_starts(problem: MergeProblem) -> list[float]:
    """tau_b (Eq. 6): tau_b(L) = t_f, tau_b(l) = tau_b(l+1) + t_b(l+1)."""
    t_b = problem.t_b
    tau_b = [0.0] * len(t_b)
    tau_b[-1] = problem.t_f
    for i in range(len(t_b) - 2, -1, -1):
        tau_b[i] = tau_b[i + 1] + t_b[i + 1]
    return tau_b


def _comm_starts(t_c: Sequence[float], ends: Sequence[float]) -> list[float]:
    """tau_c (Eq. 7): tau_c(L) = end(L), tau_c(l) = max(tau_c(l+1) + t_c(l+1), end(l)); end = tau_b + t_b.

    With merges the merged-away layers have t_c = 0, so a group's start is max(previous message's end, end of its
    lowest layer) as Eq. 14 asks (end(l) only grows as l falls).
    """
    tau_c = [0.0] * len(ends)
    tau_c[-1] = ends[-1]
    for i in range(len(ends) - 2, -1, -1):
        tau_c[i] = max(tau_c[i + 1] + t_c[i + 1], ends[i])
    return tau_c


def _check_groups(groups: Sequence[tuple[int, int]], num_layers: int) -> Groups:
    """`groups` as a tuple, or MergeError unless they cover 0..L-1 contiguously, highest first, none empty."""
    out = tuple((int(lo), int(hi)) for lo, hi in groups)
    expect_hi = num_layers
    for lo, hi in out:
        if hi != expect_hi or not 0 <= lo < hi:
            raise MergeError(
                f"groups must be non-empty contiguous ranges [lo, hi) covering layers 0..{num_layers - 1} from the "
                f"top (highest first); got {list(out)}"
            )
        expect_hi = lo
    if expect_hi != 0:
        raise MergeError(f"groups {list(out)} do not reach layer 0")
    return out


def timeline(problem: MergeProblem, groups: Sequence[tuple[int, int]] | None = None) -> MergeTimeline:
    """Evaluate Eqs. 6-8 for a merge pattern; `groups` None means WFBP (every layer its own message)."""
    n = problem.num_layers
    groups = tuple((i, i + 1) for i in range(n - 1, -1, -1)) if groups is None else _check_groups(groups, n)
    tau_b = _backward_starts(problem)
    ends = [s + t for s, t in zip(tau_b, problem.t_b, strict=True)]
    t_c = [0.0] * n
    for lo, hi in groups:
        t_c[lo] = problem.t_ar(sum(problem.p[lo:hi]))
    tau_c = _comm_starts(t_c, ends)
    return MergeTimeline(problem, groups, tuple(tau_b), tuple(tau_c), tuple(t_c), tau_c[0] + t_c[0])


def _groups_from_normal(normal: Sequence[bool]) -> Groups:
    """Groups from per-layer flags: a normal layer closes a group (it and the merged layers above it)."""
    groups = []
    hi = len(normal)
    for i in range(len(normal) - 1, -1, -1):
        if normal[i]:
            groups.append((i, hi))
            hi = i
    return tuple(groups)


# ------------------------------------------------------------------------------------------------ the baselines
def wfbp(problem: MergeProblem) -> MergeTimeline:
    """Wait-free backprop: each layer all-reduced alone as soon as its backward is done (no merges)."""
    return timeline(problem)


def sync_easgd(problem: MergeProblem) -> MergeTimeline:
    """SyncEASGD (Eq. 9): one message of all gradients after the whole backward, t_f + sum t_b + a + b sum p."""
    return timeline(problem, ((0, problem.num_layers),))


def naive_s(problem: MergeProblem) -> float:
    """Naive S-SGD (Eq. 3): no overlap and no merging, t_f + sum t_b + sum t_c."""
    return problem.compute_s + sum(problem.t_ar(x) for x in problem.p)


def speedup(problem: MergeProblem, tl: MergeTimeline, workers: int) -> float:
    """S(N) = N (t_f + sum t_b) / t_iter (Eqs. 4-5): throughput of N workers relative to one that never waits."""
    if workers < 1:
        raise MergeError(f"workers must be >= 1, got {workers}")
    if tl.t_iter <= 0:
        raise MergeError("the speedup is undefined for an iteration of zero time")
    return workers * problem.compute_s / tl.t_iter


# ---------------------------------------------------------------------------------------------- the planners
def greedy(problem: MergeProblem) -> MergeTimeline:
    """MG-WFBP's Algorithm 1 as ALGORITHMS.md 2.3 specifies it (the paper claims it is optimal; it is not).

    For l = L down to 2, with e = end(l-1) = tau_b(l-1) + t_b(l-1): if layer l's communication is not hidden
    (e < tau_c(l) + t_c(l)) and either condition 3 (tau_c(l) > e) or condition 2 with Eq. 31 (e - tau_c(l) < a)
    holds, merge l into l-1 (Eqs. 12-14: p(l-1) += p(l), t_c(l) = 0, t_c(l-1) = T_ar(p(l-1))) and recompute tau_c
    for all layers. Inequalities are strict, so a tie keeps l normal (both choices then give the same t_iter).
    Each recompute is O(L) and there are at most L-1 merges: O(L^2).

    Zero-byte layers are skipped (module docstring): l and l-1 range over the layers with bytes only. This keeps
    the rule's premise that a merge saves one start-up a, and with it the property that every merge lowers the
    finish of the layer merged into, so the greedy is never slower than WFBP.
    """
    n = problem.num_layers
    a = problem.a
    p = list(problem.p)
    t_c = [problem.t_ar(x) for x in p]
    tau_b = _backward_starts(problem)
    ends = [s + t for s, t in zip(tau_b, problem.t_b, strict=True)]
    tau_c = _comm_starts(t_c, ends)
    with_bytes = [i for i in range(n) if p[i] > 0]
    normal = [False] * n  # zero-byte layers join the group below them ...
    normal[0] = True  # ... except those under the lowest layer with bytes, which form an empty group
    for i in with_bytes:
        normal[i] = True
    for i, below in zip(reversed(with_bytes[1:]), reversed(with_bytes[:-1]), strict=True):  # l = i+1, l-1 = below+1
        e = ends[below]
        if e < tau_c[i] + t_c[i] and (tau_c[i] > e or e - tau_c[i] < a):
            p[below] += p[i]
            p[i] = 0.0
            t_c[i] = 0.0
            t_c[below] = problem.t_ar(p[below])
            normal[i] = False
            tau_c = _comm_starts(t_c, ends)  # "recompute tau_c for all layers" (only layers below l change)
    return timeline(problem, _groups_from_normal(normal))


def optimal(problem: MergeProblem) -> MergeTimeline:
    """The exact merge pattern by the O(L^2) DP of ALGORITHMS.md 2.3.

    Groups are contiguous and a group's finish time is monotone in the previous group's finish, so with E(k) the
    earliest finish of the message of a group whose lowest layer is k (layers above k already planned):
    E(L+1) = -inf, E(k) = min_{j>k} max(E(j), end(k)) + T_ar(sum_{i=k}^{j-1} p(i)), t_iter* = E(1). Ties take the
    smallest group (fewest merges). Each group's bytes are summed as a running total from its lowest layer up, in
    the order :func:`timeline` sums them, so the DP prices a pattern exactly as the timeline does; prefix-sum
    differences would not (they can cancel a tiny layer to exactly 0 bytes, and an empty group costs 0, not a).
    """
    n = problem.num_layers
    tau_b = _backward_starts(problem)
    ends = [s + t for s, t in zip(tau_b, problem.t_b, strict=True)]
    p, a, b = problem.p, problem.a, problem.b
    best = [0.0] * (n + 1)
    best[n] = -math.inf
    choice = [n] * (n + 1)
    for k in range(n - 1, -1, -1):
        end_k = ends[k]
        value = math.inf
        arg = k + 1
        nbytes = 0.0
        for j in range(k + 1, n + 1):  # the group is layers k..j-1
            nbytes += p[j - 1]
            finish = max(best[j], end_k) + (a + b * nbytes if nbytes > 0 else 0.0)
            if finish < value:
                value, arg = finish, j
        best[k], choice[k] = value, arg
    bottom_up = []
    k = 0
    while k < n:
        bottom_up.append((k, choice[k]))
        k = choice[k]
    return timeline(problem, tuple(reversed(bottom_up)))


def brute_force(problem: MergeProblem) -> MergeTimeline:
    """Try every one of the 2^(L-1) merge patterns (a check on :func:`optimal`); first best wins, WFBP first."""
    n = problem.num_layers
    if n > BRUTE_FORCE_MAX_LAYERS:
        raise MergeError(f"brute force over 2^{n - 1} patterns refused (more than {BRUTE_FORCE_MAX_LAYERS} layers)")
    tau_b = _backward_starts(problem)
    ends = [s + t for s, t in zip(tau_b, problem.t_b, strict=True)]
    p, t_ar = problem.p, problem.t_ar
    best_t, best_normal = math.inf, [True] * n
    for mask in range(1 << (n - 1)):
        # bit i-1 set: layer i (0-based, i >= 1) is merged into layer i-1; layer 0 is always normal
        normal = [True] + [not (mask >> (i - 1)) & 1 for i in range(1, n)]
        finish, nbytes = -math.inf, 0.0
        for i in range(n - 1, -1, -1):
            nbytes += p[i]
            if normal[i]:
                finish = max(finish, ends[i]) + t_ar(nbytes)
                nbytes = 0.0
        if finish < best_t:
            best_t, best_normal = finish, normal
    return timeline(problem, _groups_from_normal(best_normal))


# -------------------------------------------------------------------------------------------- all-reduce (a, b)
def allreduce_ab(algorithm: str, n: int, alpha: float, beta: float, gamma: float = 0.0) -> tuple[float, float]:
    """(a, b) of T_ar(M) = a + b M for an all-reduce over `n` workers (MG-WFBP Table II; ALGORITHMS.md 2.4).

    alpha: latency per step; beta: transfer seconds per byte; gamma: reduction seconds per byte. The ring row is
    confirmed by the authors' simulator, 2(n-1) alpha + 2(n-1) M beta / n + (n-1) M gamma / n, and takes any n; the
    other rows are Thakur and Rabenseifner's costs for n a power of two (logs base 2). One worker communicates
    nothing: (0, 0).
    """
    model = ALLREDUCE_ALGORITHMS.get(algorithm)
    if model is None or model.ab is None:
        raise MergeError(f"unknown all-reduce algorithm {algorithm!r}; choose from {', '.join(ALLREDUCE_ALGORITHMS)}")
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise MergeError(f"the worker count must be an integer >= 1, got {n!r}")
    n = int(n)
    alpha = _finite_nonneg("alpha", alpha)
    beta = _finite_nonneg("beta", beta)
    gamma = _finite_nonneg("gamma", gamma)
    if n == 1:
        return 0.0, 0.0
    if model.power_of_two and n & (n - 1):
        raise MergeError(f"{algorithm} all-reduce is modelled for a power-of-two worker count, got {n}")
    return model.ab(n, alpha, beta, gamma)
