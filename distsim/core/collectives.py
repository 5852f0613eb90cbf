"""Collective algorithms for the analytic cost model: ring and tree, each step paying the link's latency.

* **Ring** (Thakur et al. 2005; MG-WFBP Table II): all-reduce is a reduce-scatter then an all-gather, 2(n-1) steps
  each moving 1/n of the message, so 2(n-1) alpha + 2(n-1)/n S / B; all-gather and reduce-scatter are one half of
  that, (n-1) alpha + (n-1)/n S / B. An all-to-all (NCCL's is grouped point-to-point sends) moves the same volume in
  the same steps: each member keeps 1/n of its S bytes and sends the rest, 1/n to each peer.
* **Tree** (NCCL's double binary tree, Sanders et al. 2009, "Two-tree algorithms for full bandwidth broadcast,
  reduction and scan"; NCCL 2.4 release): all-reduce is a pipelined reduce up and broadcast down the tree, 2 log2(n)
  latency steps; NCCL's model takes its algorithm bandwidth as half the bus bandwidth with a 0.92 correction
  (``src/graph/tuning.cc``: ``busBw * .92`` for tree all-reduce, ratio .5 for non-ring algorithms), so
  2 log2(n) alpha + 2 S / (0.92 B). NCCL uses trees only for all-reduce and only across nodes (inside a node its
  tree is a chain, with as many steps as the ring).

NCCL picks, for each collective and size, the algorithm its cost model predicts fastest; so does this module: tree
for an inter-node all-reduce below the size where the ring's extra 2(n-1-log2 n) latency steps cost less than the
tree's extra bandwidth term, S* = 2 (n - 1 - log2 n) alpha B / (2/0.92 - 2(n-1)/n), ring above it.

All-reduce algorithms are a registry (:data:`COLLECTIVE_ALGORITHMS`; a new one is a :class:`CollectiveAlgorithm` and
:func:`register_collective_algorithm`), each with the cost models it has:

* an analytic one (``all_reduce_s``), what :class:`distsim.sim.costs.AnalyticCosts` gives an inter-node all-reduce
  and what ``--allreduce`` chooses (:data:`ANALYTIC_ALGORITHMS`): ``nccl``, ring or tree, whichever NCCL's model finds
  faster; ``ring``; ``tree``. Inside a node every all-reduce is the ring (NCCL's tree is a chain there), and
  all-gather and reduce-scatter are rings everywhere;
* a linear one (``ab``), (a, b) of T(M) = a + b M from MG-WFBP's Table II, what
  :func:`distsim.core.mgwfbp.allreduce_ab` models (:data:`LINEAR_ALGORITHMS`): ``ring``, ``binary-tree``,
  ``recursive-doubling``, ``rabenseifner`` (Thakur et al. 2005; logs base 2, power-of-two worker counts but the ring).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from distsim.core.errors import UnknownNameError, suggest

TREE_BUS_BANDWIDTH = 0.92
"""NCCL's correction of the tree all-reduce bus bandwidth (src/graph/tuning.cc)."""


def ring_volume(collective: str, n: int) -> float:
    """Bytes each member moves per byte of message (ring algorithms)."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def ring_steps(collective: str, n: int) -> int:
    """Latency terms of the ring algorithm."""
    if collective == "all_reduce":
        return 2 * (n - 1)
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return n - 1
    return 1


def tree_steps(n: int) -> int:
    """Latency terms of a (double binary) tree all-reduce: up and down a tree of depth ceil(log2 n)."""
    return 2 * math.ceil(math.log2(n)) if n > 1 else 0


def ring_s(collective: str, n: int, nbytes: float, latency_s: float, bandwidth: float) -> float:
    return ring_steps(collective, n) * latency_s + ring_volume(collective, n) * nbytes / bandwidth


def tree_all_reduce_s(n: int, nbytes: float, latency_s: float, bandwidth: float) -> float:
    return tree_steps(n) * latency_s + 2 * nbytes / (TREE_BUS_BANDWIDTH * bandwidth)


def collective_s(
    collective: str, n: int, nbytes: float, latency_s: float, bandwidth: float, algorithm: str = "ring"
) -> tuple[float, str]:
    """(seconds, algorithm run) of a collective over n members: an all-reduce by `algorithm` (a name of
    :data:`ANALYTIC_ALGORITHMS`; ``ring`` inside a node), any other collective by the ring."""
    if collective != "all_reduce":
        return ring_s(collective, n, nbytes, latency_s, bandwidth), "ring"
    return analytic_algorithm(algorithm).all_reduce_s(n, nbytes, latency_s, bandwidth)  # type: ignore[misc]


# ------------------------------------------------------------------------------------------------------ registry
AllReduceSeconds = Callable[[int, float, float, float], tuple[float, str]]
"""(n, nbytes, latency_s, bandwidth) -> (seconds, algorithm run) of one all-reduce."""
AllReduceAB = Callable[[int, float, float, float], tuple[float, float]]
"""(n >= 2, alpha, beta, gamma) -> (a, b) of T(M) = a + b M."""


@dataclass(frozen=True)
class CollectiveAlgorithm:
    """A named all-reduce algorithm and the cost models it has (the module docstring)."""

    name: str
    summary: str
    """One line for ``--help``."""
    label: str = ""
    """How a report names the costs it gave (``all-reduce by NCCL's ring or tree``); empty: ``<name> all-reduce``."""
    all_reduce_s: AllReduceSeconds | None = None
    """The analytic model: (seconds, algorithm run) of an inter-node all-reduce of `nbytes` over `n` members, each
    step paying `latency_s`, at `bandwidth` bytes/s; None: the analytic costs cannot take it."""
    ab: AllReduceAB | None = None
    """The linear model: (a, b) over n >= 2 workers from alpha (seconds per step), beta (transfer seconds per byte)
    and gamma (reduction seconds per byte); None: MG-WFBP's planners cannot take it."""
    power_of_two: bool = False
    """``ab`` holds for a power-of-two worker count only."""

    def describe(self) -> str:
        """How a report names the costs it gave."""
        return self.label or f"{self.name} all-reduce"


COLLECTIVE_ALGORITHMS: dict[str, CollectiveAlgorithm] = {}


def register_collective_algorithm(algorithm: CollectiveAlgorithm) -> CollectiveAlgorithm:
    """Add (or replace) an all-reduce algorithm; it is a choice of ``--allreduce`` if it has an analytic model and
    of :func:`distsim.core.mgwfbp.allreduce_ab` if it has a linear one."""
    COLLECTIVE_ALGORITHMS[algorithm.name] = algorithm
    return algorithm


def collective_algorithm_names() -> tuple[str, ...]:
    return tuple(COLLECTIVE_ALGORITHMS)


class _Having(Mapping[str, CollectiveAlgorithm]):
    """The registered algorithms that have one cost model, read live (a name registered later is one of them)."""

    def __init__(self, model: str) -> None:
        self._model = model

    def _names(self) -> list[str]:
        return [k for k, a in COLLECTIVE_ALGORITHMS.items() if getattr(a, self._model) is not None]

    def __getitem__(self, name: str) -> CollectiveAlgorithm:
        found = COLLECTIVE_ALGORITHMS[name]
        if getattr(found, self._model) is None:
            raise KeyError(name)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


ANALYTIC_ALGORITHMS: Mapping[str, CollectiveAlgorithm] = _Having("all_reduce_s")
"""Algorithms the analytic costs can give an inter-node all-reduce (``--allreduce``'s choices)."""
LINEAR_ALGORITHMS: Mapping[str, CollectiveAlgorithm] = _Having("ab")
"""Algorithms with MG-WFBP's linear model (:func:`distsim.core.mgwfbp.allreduce_ab`)."""


def analytic_algorithm(name: str) -> CollectiveAlgorithm:
    """The algorithm `name` of :data:`ANALYTIC_ALGORITHMS`, or one line naming the choices."""
    try:
        return ANALYTIC_ALGORITHMS[name]
    except KeyError:
        known = list(ANALYTIC_ALGORITHMS)
        raise UnknownNameError(f"unknown all-reduce algorithm {name!r}{suggest(name, known)}") from None


def _ring(n: int, nbytes: float, latency_s: float, bandwidth: float) -> tuple[float, str]:
    return ring_s("all_reduce", n, nbytes, latency_s, bandwidth), "ring"


def _tree(n: int, nbytes: float, latency_s: float, bandwidth: float) -> tuple[float, str]:
    if n < 2:
        return _ring(n, nbytes, latency_s, bandwidth)
    return tree_all_reduce_s(n, nbytes, latency_s, bandwidth), "tree"


def _nccl(n: int, nbytes: float, latency_s: float, bandwidth: float) -> tuple[float, str]:
    ring = ring_s("all_reduce", n, nbytes, latency_s, bandwidth)
    if n > 2:
        t = tree_all_reduce_s(n, nbytes, latency_s, bandwidth)
        if t < ring:
            return t, "tree"
    return ring, "ring"


def _log2(n: int) -> int:
    return n.bit_length() - 1


register_collective_algorithm(CollectiveAlgorithm(
    "nccl", "ring or double binary tree, whichever NCCL's cost model finds faster", "all-reduce by NCCL's ring or tree",
    all_reduce_s=_nccl,
))  # fmt: skip
register_collective_algorithm(CollectiveAlgorithm(
    "ring", "ring only, as MG-WFBP's analysis assumes", "ring all-reduce only", all_reduce_s=_ring,
    ab=lambda n, alpha, beta, gamma: (2 * (n - 1) * alpha, (2 * (n - 1) * beta + (n - 1) * gamma) / n),
))  # fmt: skip
register_collective_algorithm(CollectiveAlgorithm(
    "tree", "NCCL's double binary tree only", "all-reduce by NCCL's double binary tree", all_reduce_s=_tree,
))  # fmt: skip
register_collective_algorithm(CollectiveAlgorithm(
    "binary-tree", "binary tree reduce then broadcast", power_of_two=True,
    ab=lambda n, alpha, beta, gamma: (2 * alpha * _log2(n), (2 * beta + gamma) * _log2(n)),
))  # fmt: skip
register_collective_algorithm(CollectiveAlgorithm(
    "recursive-doubling", "recursive doubling", power_of_two=True,
    ab=lambda n, alpha, beta, gamma: (alpha * _log2(n), (beta + gamma) * _log2(n)),
))  # fmt: skip
register_collective_algorithm(CollectiveAlgorithm(
    "rabenseifner", "Rabenseifner's reduce-scatter then all-gather", power_of_two=True,
    # 2 beta - (2 beta + gamma)/n + gamma
    ab=lambda n, alpha, beta, gamma: (2 * alpha * _log2(n), (2 * beta + gamma) * (n - 1) / n),
))  # fmt: skip
