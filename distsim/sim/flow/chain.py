"""A stage template's ops (:class:`StageOp`) and a run of them on one GPU laid out for the event flow
(:class:`Chain`, which :meth:`distsim.sim.flow.events.EventFlow.add_chain` appends at once)."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate

from distsim.sim.costs import CommEvent
from distsim.sim.engine import PREV, _Prev


@dataclass(frozen=True)
class StageOp:
    """One step of a stage's forward or backward template."""

    kind: int
    dur: float
    key: int
    name: str
    layer: int
    comm: CommEvent | None = None
    launch: float = 0.0
    """Host seconds to enqueue the op's kernels (0: launches not modelled)."""

    def scaled(self, speed: float) -> float:
        """Its duration on a GPU `speed` times slower: compute stretches, a collective does not."""
        return self.dur if self.comm is not None else self.dur * speed


@dataclass(frozen=True)
class Chain:
    """A run of a stage template's ops on one GPU, laid out for :meth:`EventFlow.add_chain`."""

    durations: tuple[float, ...]
    slots: tuple[tuple[tuple[int, int]], ...]
    """The one (gpu, stream) slot of each op."""
    kinds: tuple[int, ...]
    names: tuple[str, ...]
    layers: tuple[int, ...]
    keys: tuple[int, ...]
    links: tuple[tuple[bool, int], ...]
    """Per op: (it waits for the chain's first dependencies: the first op; the index in the chain of the previous op
    on its slot, or -1: the slot's last task before it)."""
    last_on_slot: tuple[tuple[tuple[int, int], int], ...]
    """(slot, index of the chain's last op on it)."""
    launch_ends: tuple[float, ...] = ()
    """Per op: when its launch ends, from the start of the host task that enqueues the chain (cumulative launches)."""
    launch_constrained: tuple[int, ...] = ()
    """Ops whose launch can delay them: the first, and each whose launch outlasts the previous op (whose start is no
    earlier than its own launch end, so it implies the rest)."""

    @cached_property
    def rel_deps(self) -> tuple[tuple[int, int], ...]:
        """:attr:`links` as :meth:`~EventFlow.add_chain` uses them, per op: (index of the op before it, index of the
        previous op on its slot if that is another one, else -1); op 0's entry is a placeholder."""
        return tuple((i - 1, prev if prev != i - 1 else -1) for i, (_, prev) in enumerate(self.links))

    @cached_property
    def columns(self) -> tuple[array[float], array[int], array[int], array[int]]:
        """Durations, kinds, layers and keys as the flow's arrays hold them (extending an array by another of its
        type copies memory; by a tuple it converts each number)."""
        return array("d", self.durations), array("b", self.kinds), array("i", self.layers), array("i", self.keys)

    @cached_property
    def prevs(self) -> tuple[_Prev, ...]:
        """:data:`~distsim.sim.engine.PREV` per op: what :meth:`~EventFlow.add_chain` writes before filling in the
        ops that wait for more (:attr:`slot_lookups`)."""
        return (PREV,) * len(self.links)

    @cached_property
    def slot_lookups(self) -> tuple[int, ...]:
        """Ops that are the first on their slot in the chain (op 0 among them): they wait for the slot's last task."""
        return tuple(i for i, (_, prev) in enumerate(self.links) if prev < 0)

    @property
    def launch_s(self) -> float:
        """Host seconds to enqueue the whole chain."""
        return self.launch_ends[-1] if self.launch_ends else 0.0

    @classmethod
    def of(cls, ops: Sequence[StageOp], slots: Sequence[tuple[tuple[int, int]]], speed: float) -> Chain:
        """Ops with their slots, each the one-slot tuple a builder shares among its tasks on that stream (the
        per-GPU figures group tasks by it: :func:`distsim.sim.metrics.slot_groups`); compute durations scaled by the
        GPU's `speed` factor (as :meth:`action` does). The first op waits for the chain's first dependencies, a
        compute op or a collective (sequence parallelism's all-gather starts a block)."""
        seen: dict[tuple[int, int], int] = {}
        links = []
        for i, (slot,) in enumerate(slots):
            links.append((i == 0, seen.get(slot, -1)))
            seen[slot] = i
        durations = tuple(op.scaled(speed) for op in ops)
        ends = tuple(accumulate(op.launch for op in ops))
        constrained = tuple(i for i in range(len(ops)) if i == 0 or durations[i - 1] < ops[i].launch)
        return cls(
            durations=durations,
            slots=tuple(slots),
            kinds=tuple(op.kind for op in ops),
            names=tuple(op.name for op in ops),
            layers=tuple(op.layer for op in ops),
            keys=tuple(op.key for op in ops),
            links=tuple(links),
            last_on_slot=tuple(seen.items()),
            launch_ends=ends,
            launch_constrained=constrained,
        )


Slots = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class ActionBlock:
    """A schedule action's tasks on one GPU as :meth:`EventFlow.add_action` appends them at once, the same for every
    micro-batch of a stage and op: the host task that enqueues its kernels (optional), the stage template's
    :class:`Chain`, and after the chain's last op what waits for it alone: the transfer of its result and the shadow
    that transfer casts on the compute stream (each optional). Its columns are laid out once."""

    chain: Chain
    host: tuple[float, Slots] | None
    """(seconds to launch the chain's kernels, the host stream's slots); None: launches not modelled."""
    after: tuple[tuple[float, Slots, int, int, str], ...]
    """(duration, slots, kind, event key, name) of each task after the chain, in order."""
    members: tuple[int, ...] | None
    """The GPUs of the transfer (the first task after the chain); None: no transfer."""
    durations: tuple[float, ...]
    slots: tuple[Slots, ...]
    kinds: bytes
    names: tuple[str, ...]
    """Every task's name but the host task's (which names its micro-batch)."""
    layers: tuple[int, ...]
    keys: tuple[int, ...]

    @classmethod
    def of(cls, chain: Chain, host: tuple[float, Slots] | None, after: Sequence[tuple[float, Slots, int, int, str]],
           members: tuple[int, ...] | None, host_kind: int) -> ActionBlock:  # fmt: skip
        head = [(host[0], host[1], host_kind, -1)] if host is not None else []
        rows = [*head, *zip(chain.durations, chain.slots, chain.kinds, chain.keys, strict=True),
                *((d, s, k, key) for d, s, k, key, _ in after)]  # fmt: skip
        return cls(
            chain=chain,
            host=host,
            after=tuple(after),
            members=members,
            durations=tuple(r[0] for r in rows),
            slots=tuple(r[1] for r in rows),
            kinds=bytes(r[2] for r in rows),
            names=(*chain.names, *(name for *_, name in after)),
            layers=(*([-1] * len(head)), *chain.layers, *([-1] * len(after))),
            keys=tuple(r[3] for r in rows),
        )

    @cached_property
    def prevs(self) -> tuple[_Prev, ...]:
        """:data:`~distsim.sim.engine.PREV` per task, what :meth:`EventFlow.add_action` writes before filling in
        those that wait for more."""
        return (PREV,) * len(self.durations)
