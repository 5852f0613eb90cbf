"""The layer DAG as DeepPool's planner sees it: one chain of layers and branch/join blocks (Park et al. 2022,
Sec. 4.2, Fig. 7; ALGORITHMS.md 1.2 and 1.5).

A block runs from a branching layer (out-degree > 1) to its joining layer, the branching layer's immediate
post-dominator; its branches are chains of layers and nested blocks, and a branch may end by forking again into
branches that all end at the same join (Inception-v3's Mixed_7b and Mixed_7c: the 3x3 branch splits into a 1x3 and a
3x1 convolution, both concatenated by the module's join). Any other graph (two first layers, an edge from one
branch into another, a join fed from outside its block) is refused with a :class:`BurstError` naming the layer.

Pure: no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distsim.core.errors import DistsimError


class BurstError(DistsimError):
    """A DeepPool planning problem that cannot be planned: no feasible GPU count, a bad limit, a layer graph the
    branch/join reduction cannot take."""


@dataclass(frozen=True)
class Branch:
    """A chain of layers and blocks; a branch inside a block may end in a layer that forks into sub-branches which
    all end at the block's join. A branch with no items is a direct edge from the block's entry to its join."""

    items: tuple[int | Block, ...]
    forks: tuple[Branch, ...] = ()


@dataclass(frozen=True)
class Block:
    """From the layer before it (the branching layer) to `join`, its immediate post-dominator."""

    branches: tuple[Branch, ...]
    join: int


def decompose(names: Sequence[str], inputs: Sequence[Sequence[int]]) -> Branch:
    """The layer DAG as one chain of layers and (nested) branch/join blocks; BurstError naming the first layer
    where the graph is not of that form (several first or last layers, an edge that leaves a block)."""
    n = len(inputs)
    succ: list[list[int]] = [[] for _ in range(n)]
    for j, ins in enumerate(inputs):
        for i in ins:
            succ[i].append(j)
    heads = [i for i in range(n) if not inputs[i]]
    tails = [i for i in range(n) if not succ[i]]
    if heads != [0] or tails != [n - 1]:
        raise BurstError(
            f"the layer graph is not a chain of branch/join blocks: it needs one first and one last layer, and has "
            f"{len(heads)} without inputs and {len(tails)} whose output nothing uses"
        )
    ipdom = [n - 1] * n  # immediate post-dominators (Cooper et al.'s intersection, by topological index)
    for u in range(n - 2, -1, -1):
        best = succ[u][0]
        for v in succ[u][1:]:
            while best != v:
                while best < v:
                    best = ipdom[best]
                while v < best:
                    v = ipdom[v]
        ipdom[u] = best
    seen = [False] * n

    def bad(i: int, why: str) -> BurstError:
        return BurstError(f"the layer graph is not a chain of branch/join blocks: layer {names[i]!r} {why}")

    def visit(i: int) -> None:
        if seen[i]:
            raise bad(i, "is reached from two blocks")
        seen[i] = True

    def ends(branches: Sequence[Branch]) -> int:
        return sum(ends(b.forks) if b.forks else 1 for b in branches)

    def walk(first: int, join: int | None) -> Branch:
        if first == join:
            return Branch(())
        if len(inputs[first]) > 1:
            raise bad(first, "joins branches that do not open at one layer")
        visit(first)
        items: list[int | Block] = [first]
        cur = first
        while True:
            nxt = succ[cur]
            if not nxt:
                return Branch(tuple(items))  # the last layer (top level only: a block's layers reach its join)
            if len(nxt) == 1:
                if nxt[0] == join:
                    return Branch(tuple(items))
                if len(inputs[nxt[0]]) > 1:
                    raise bad(nxt[0], "joins branches that do not open at one layer")
                cur = nxt[0]
                visit(cur)
                items.append(cur)
                continue
            j = ipdom[cur]
            if j == join:
                return Branch(tuple(items), tuple(walk(c, join) for c in nxt))
            if join is not None and j > join:
                raise bad(cur, f"branches past the join of its block ({names[join]!r})")
            block = Block(tuple(walk(c, j) for c in nxt), j)
            if ends(block.branches) != len(inputs[j]):
                raise bad(j, f"takes inputs from outside the block that {names[cur]!r} opens")
            visit(j)
            items.append(block)
            cur = j

    top = walk(0, None)
    missing = [i for i in range(n) if not seen[i]]
    if missing:
        raise bad(missing[0], "is not on the chain of blocks from the first layer")
    return top


def layers_of(branch: Branch) -> list[int]:
    """Every layer of a branch: its chain's layers, its blocks' layers and joins, its forks' layers."""
    out: list[int] = []
    for item in branch.items:
        if isinstance(item, Block):
            for b in item.branches:
                out += layers_of(b)
            out.append(item.join)
        else:
            out.append(item)
    for f in branch.forks:
        out += layers_of(f)
    return out


def side_by_side(top: Branch, gpus: Sequence[int], total: int) -> dict[int, tuple[int, ...]]:
    """GPU ids per layer for per-layer counts `gpus`: a block's branches side by side on disjoint GPUs when their
    widths (each branch's largest count) fit in the `total` GPUs from the block's own first GPU, the widest first;
    otherwise every branch from that first GPU, as every layer of the chain is (GPUs 0..g-1 at the top level). The
    planner counts branches as concurrent; disjoint GPUs let them be (on shared GPUs they take turns)."""
    devices: dict[int, tuple[int, ...]] = {}

    def chain(items: Sequence[int | Block], first: int) -> None:
        for item in items:
            if isinstance(item, Block):
                together(item.branches, first)
                item_layer = item.join
            else:
                item_layer = item
            devices[item_layer] = tuple(range(first, first + gpus[item_layer]))

    def together(branches: Sequence[Branch], first: int) -> None:
        widths = {id(b): max((gpus[i] for i in layers_of(b)), default=0) for b in branches}
        fits = first + sum(widths.values()) <= total
        at = first
        for b in sorted(branches, key=lambda b: -widths[id(b)]):
            chain(b.items, at)
            if b.forks:
                together(b.forks, at)
            at += widths[id(b)] if fits else 0

    chain(top.items, 0)
    return devices
