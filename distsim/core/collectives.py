"""Collective algorithms for the analytic cost model: ring and tree, each step paying the link's latency.

* **Ring** (Thakur et al. 2005; MG-WFBP Table II): all-reduce is a reduce-scatter then an all-gather, 2(n-1) steps
  each moving 1/n of the message, so 2(n-1) alpha + 2(n-1)/n S / B; all-gather and reduce-scatter are one half of
  that, (n-1) alpha + (n-1)/n S / B.
* **Tree** (NCCL's double binary tree, Sanders et al. 2009, "Two-tree algorithms for full bandwidth broadcast,
  reduction and scan"; NCCL 2.4 release): all-reduce is a pipelined reduce up and broadcast down the tree, 2 log2(n)
  latency steps; NCCL's model takes its algorithm bandwidth as half the bus bandwidth with a 0.92 correction
  (``src/graph/tuning.cc``: ``busBw * .92`` for tree all-reduce, ratio .5 for non-ring algorithms), so
  2 log2(n) alpha + 2 S / (0.92 B). NCCL uses trees only for all-reduce and only across nodes (inside a node its
  tree is a chain, with as many steps as the ring).

NCCL picks, for each collective and size, the algorithm its cost model predicts fastest; so does this module: tree
for an inter-node all-reduce below the size where the ring's extra 2(n-1-log2 n) latency steps cost less than the
tree's extra bandwidth term, S* = 2 (n - 1 - log2 n) alpha B / (2/0.92 - 2(n-1)/n), ring above it.
"""

from __future__ import annotations

import math

TREE_BUS_BANDWIDTH = 0.92
"""NCCL's correction of the tree all-reduce bus bandwidth (src/graph/tuning.cc)."""


def ring_volume(collective: str, n: int) -> float:
    """Bytes each member moves per byte of message (ring algorithms)."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


def ring_steps(collective: str, n: int) -> int:
    """Latency terms of the ring algorithm."""
    if collective == "all_reduce":
        return 2 * (n - 1)
    if collective in ("all_gather", "reduce_scatter"):
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
    collective: str, n: int, nbytes: float, latency_s: float, bandwidth: float, tree: bool
) -> tuple[float, str]:
    """(seconds, algorithm) of a collective over n members: the faster of ring and, where allowed (`tree`: an
    inter-node all-reduce), tree."""
    ring = ring_s(collective, n, nbytes, latency_s, bandwidth)
    if tree and collective == "all_reduce" and n > 2:
        t = tree_all_reduce_s(n, nbytes, latency_s, bandwidth)
        if t < ring:
            return t, "tree"
    return ring, "ring"
