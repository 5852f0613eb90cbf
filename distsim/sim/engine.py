"""Execution of an event flow: each task's start and end.

A task becomes ready when its last dependency finishes (its predecessor on each member's stream is one of its
dependencies, so a collective starts when every member is ready) and it is released (a kernel does not start before
the host has enqueued it); a ready task starts at once and finishes after its duration. The flow builder fixes every
stream's order when it adds the tasks, so nothing is decided while the flow runs: the discrete-event execution is
the longest path through the dependency graph, and :func:`run` computes it in one pass over the tasks in
topological order (task id order, in which every builder adds them; any other order is sorted first).

:func:`run_simpy` executes the same flow as a SimPy discrete-event simulation: one SimPy event per task finish with a
shared callback. It is the reference the pass is tested against (equal to the last bit: both add each duration to
the latest of the same finish times). The pass is about ten times faster (``benchmarks/bench_engine.py`` times both).
Where a resource is shared without a fixed order (fair link sharing: inter-node transfers share the nodes' NICs while
they overlap) durations depend on the timeline and no single pass can give them: :func:`distsim.sim.network.run_shared`
extends the SimPy simulation with those shared resources, and equals :func:`run` where nothing is shared.
"""

from __future__ import annotations

import gc
import heapq
from array import array
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, MutableSequence, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import simpy
from simpy.events import NORMAL, Event


class _Prev:
    """The dependency list of a task that waits for the task before it and nothing else (see :data:`PREV`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PREV"


PREV = _Prev()
"""Stands, in a dependency list's place, for ``[j - 1]``: how an event flow stores most ops of a chain (a stage
template's ops on one GPU, each after the one before; :meth:`distsim.sim.flow.events.EventFlow.add_chain`). One shared
object instead of a list per op: a large flow is mostly such ops. :func:`run` reads it, and an int d in a list's
place as ``[d]`` (a flow's task whose other dependencies d implies); the flow expands both for every other reader."""


class ChainRelease:
    """In a host task's release list, the launch constraints of one chain at once: task ``first + i`` starts no
    earlier than ``base + ends[i]`` after the host task starts, for each i in `indices` (what
    :meth:`~distsim.sim.flow.events.EventFlow.add_chain` would otherwise append one pair per op)."""

    __slots__ = ("base", "ends", "first", "indices")

    def __init__(self, first: int, base: float, indices: Sequence[int], ends: Sequence[float]) -> None:
        self.first, self.base, self.indices, self.ends = first, base, indices, ends

    def pairs(self) -> list[tuple[int, float]]:
        """The (task, offset) pairs it stands for, in op order."""
        first, base, ends = self.first, self.base, self.ends
        return [(first + i, base + ends[i]) for i in self.indices]


class Releases:
    """A host task's release list when it is only (task, offset) pairs, appended one by one
    (:meth:`~distsim.sim.flow.events.EventFlow.release`): a sequence of those pairs kept as two arrays. A full flow
    has one pair for nearly every kernel it simulates op by op; as tuples in a list each would take about 100
    bytes, here 12."""

    __slots__ = ("offsets", "tasks")

    def __init__(self) -> None:
        self.tasks: array[int] = array("i")
        self.offsets: array[float] = array("d")

    def append(self, pair: tuple[int, float]) -> None:
        self.tasks.append(pair[0])
        self.offsets.append(pair[1])

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[tuple[int, float]]:
        return zip(self.tasks, self.offsets, strict=True)

    def __getitem__(self, i: int) -> tuple[int, float]:
        return self.tasks[i], self.offsets[i]


def expand_releases(releases: Mapping[int, Sequence[object]]) -> dict[int, list[tuple[int, float]]]:
    """Release lists with every :class:`ChainRelease` replaced by the pairs it stands for, in place (order kept)."""
    out: dict[int, list[tuple[int, float]]] = {}
    for h, items in releases.items():
        pairs: list[tuple[int, float]] = []
        for item in items:
            if type(item) is ChainRelease:
                pairs += item.pairs()
            else:
                pairs.append(item)  # type: ignore[arg-type]
        out[h] = pairs
    return out


LARGE = 1 << 20
"""Tasks from which :func:`run` gives their times as :class:`Times`, below as lists: a list takes 32 bytes a float
(a full flow of 17 million tasks, half a gigabyte each for starts and ends), an array 8, but a float read from a
list is not allocated again, which makes a small flow's pass about a fifth faster."""


class Times(array):  # type: ignore[type-arg]
    """Seconds of each task as ``array('d')`` (8 bytes each, a list takes 32), equal to any list or tuple of the
    same floats as a list of them would be."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple)):
            return self.tolist() == list(other)
        return array.__eq__(self, other)  # type: ignore[no-any-return]

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class EngineResult:
    """Each task's start and end (index = task id): sequences of floats, which :func:`run` gives as lists, or for
    a flow of :data:`LARGE` tasks or more as :class:`Times` (a quarter of a list's memory; numpy reads them without
    a copy)."""

    start_s: Sequence[float]
    end_s: Sequence[float]

    @property
    def makespan_s(self) -> float:
        return max(self.end_s, default=0.0)


def run(
    duration_s: Sequence[float],
    deps: Sequence[Sequence[int]],
    releases: Mapping[int, Sequence[tuple[int, float]]] | None = None,
) -> EngineResult:
    """Execute tasks `0..n-1` with the given durations and dependency lists; return their start and end times.

    `releases`: task -> (other task, offset): the other task starts no earlier than `offset` seconds after this one
    starts (a kernel is not started before the host has enqueued it). A dependency list may be :data:`PREV` or an
    int, and a release list may hold :class:`ChainRelease` items or be a :class:`Releases` (an event flow's compact
    form). Raises ``RuntimeError`` on a cycle."""
    n = len(duration_s)
    releases = releases or {}
    if n >= LARGE:
        start: MutableSequence[float] = Times("d", bytes(8 * n))
        end: MutableSequence[float] = Times("d", bytes(8 * n))
    else:
        start, end = [0.0] * n, [0.0] * n
    if not _in_id_order(duration_s, deps, releases, start, end):
        after = _released_by(n, releases)
        _longest_path(_topological_order(n, deps, after), duration_s, deps, after, start, end)
    return EngineResult(start, end)


def _pairs(item: object) -> Iterable[tuple[int, float]]:
    """The (task, offset) pairs of one item of a release list, a pair itself or a :class:`ChainRelease`."""
    if type(item) is ChainRelease:
        first, base, ends = item.first, item.base, item.ends
        return [(first + i, base + ends[i]) for i in item.indices]
    return (item,)  # type: ignore[return-value]


def _released_by(n: int, releases: Mapping[int, Sequence[object]]) -> list[list[tuple[int, float]] | None]:
    """Task -> (host task, offset) of its releases (None: none)."""
    after: list[list[tuple[int, float]] | None] = [None] * n
    for h, items in releases.items():
        for item in items:
            for j, offset in _pairs(item):
                got = after[j]
                if got is None:
                    after[j] = [(h, offset)]
                else:
                    got.append((h, offset))
    return after


def _in_id_order(
    duration_s: Sequence[float],
    deps: Sequence[Sequence[int]],
    releases: Mapping[int, Sequence[object]],
    start: MutableSequence[float],
    end: MutableSequence[float],
) -> bool:
    """Fill `start` and `end` task by task in id order, the order every builder adds tasks in; False (and stop) at a
    task that waits for a later one (the caller then sorts them: :func:`_topological_order`).

    A host task's releases are pushed when it starts: each released task's floor (the latest start + offset so far)
    rises, and the task starts no earlier than its floor. That is the same maximum as reading them when the task
    comes, without an index of every task's releases (a full flow has millions)."""
    prev = PREV
    floor = [_NO_FLOOR] * len(duration_s)
    hosts = sorted(releases)
    hosts.append(-1)
    k = 0
    host = hosts[0]
    e = 0.0  # the end of the task before
    for j, ds, t, d in zip(range(len(duration_s)), deps, floor, duration_s, strict=True):  # floor[j] as pushed by then
        if ds is prev:  # the task before it alone, which ended at or after 0
            s = e
        elif type(ds) is int:  # one task, which ended at or after 0
            if ds >= j:
                return False
            s = end[ds]
        else:
            s = 0.0
            for x in ds:
                if x >= j:
                    return False
                e = end[x]
                if e > s:
                    s = e
        if t > s:
            s = t
        start[j] = s
        e = s + d
        end[j] = e
        if j == host:
            if not _push(floor, j, s, releases[j]):
                return False
            k += 1
            host = hosts[k]
    return True


_NO_FLOOR = float("-inf")
"""A task's release floor before any host task pushed one (every start is at least 0)."""


def _push(floor: list[float], h: int, s: float, items: Sequence[object]) -> bool:
    """Raise the floors of the tasks host task `h`, started at `s`, releases; False if one of them is not later
    than `h` (the flow is not in id order)."""
    if type(items) is Releases:
        for r, offset in zip(items.tasks, items.offsets, strict=True):
            if r <= h:
                return False
            t = s + offset
            if t > floor[r]:
                floor[r] = t
        return True
    for item in items:
        if type(item) is ChainRelease:
            first, base, ends = item.first, item.base, item.ends
            for i in item.indices:
                r = first + i
                if r <= h:
                    return False
                t = s + (base + ends[i])
                if t > floor[r]:
                    floor[r] = t
        else:
            r, offset = item  # type: ignore[misc]
            if r <= h:
                return False
            t = s + offset
            if t > floor[r]:
                floor[r] = t
    return True


def _longest_path(
    order: Iterable[int],
    duration_s: Sequence[float],
    deps: Sequence[Sequence[int]],
    after: Sequence[Sequence[tuple[int, float]] | None],
    start: list[float],
    end: list[float],
) -> None:
    """Fill `start` and `end` in `order`, a topological order of the tasks."""
    prev = PREV
    for j in order:
        ds = deps[j]
        s = end[j - 1] if ds is prev else end[ds] if type(ds) is int else max((end[d] for d in ds), default=0.0)
        for h, offset in after[j] or ():
            t = start[h] + offset
            if t > s:
                s = t
        start[j] = s
        end[j] = s + duration_s[j]


def _topological_order(
    n: int, deps: Sequence[Sequence[int]], after: Sequence[Sequence[tuple[int, float]] | None]
) -> list[int]:
    """Kahn's order (smallest ready id first); ``RuntimeError`` naming some tasks on a cycle."""
    dependents: list[list[int]] = [[] for _ in range(n)]
    waiting = [0] * n
    for j in range(n):
        ds = deps[j]
        preds = ([j - 1] if ds is PREV else [ds] if type(ds) is int else list(ds)) + [h for h, _ in after[j] or ()]
        waiting[j] = len(preds)
        for d in preds:
            dependents[d].append(j)
    ready = [j for j in range(n) if waiting[j] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in dependents[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) < n:
        blocked = [i for i in range(n) if waiting[i] > 0]
        raise RuntimeError(f"event flow has a cycle: {len(blocked)} tasks never became ready (e.g. {blocked[:5]})")
    return order


def run_simpy(
    duration_s: Sequence[float],
    deps: Sequence[Sequence[int]],
    releases: Mapping[int, Sequence[tuple[int, float]]] | None = None,
) -> EngineResult:
    """:func:`run` as a SimPy discrete-event simulation (the reference)."""
    with paused_gc():
        return _run_simpy(duration_s, deps, releases or {})


@contextmanager
def paused_gc() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block. Building and running a flow allocates millions of small
    objects and no cycles; with the collector on, its passes over them take about half of a large flow's build."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Timer(Event):
    """An event `delay` seconds from now with one callback, its list set at construction (cheaper than a SimPy
    timeout plus a callback append, for millions of tasks)."""

    def __init__(self, env: simpy.Environment, delay: float, value: object, callback: object) -> None:
        self.env = env
        self.callbacks = [callback]  # type: ignore[list-item]
        self._value = value
        self._ok = True
        env.schedule(self, NORMAL, delay)


OwnStarter = Callable[[simpy.Environment, Callable[[int, float], None], Callable[[Event], None]],
                      Callable[[int, float], None]]  # fmt: skip
"""``make(env, finish, done) -> start``: how an engine runs the tasks it handles itself (:func:`simulate_events`)."""


def simulate_events(
    duration_s: Sequence[float],
    deps: Sequence[Sequence[int]],
    releases: Mapping[int, Sequence[tuple[int, float]]],
    own: Container[int] = frozenset(),
    make_start: OwnStarter | None = None,
) -> tuple[list[float], list[float]]:
    """The SimPy event loop every discrete-event engine here shares: a task starts when its dependencies have ended
    and its releases have passed, and (unless it is in `own`) ends its duration later. A task in `own` is started by
    ``make_start(env, finish, done)(task, now)`` instead, which must end it by ``finish(task, now)`` or by a
    :class:`Timer` whose callback is ``done``. Returns every task's (start, end); ``RuntimeError`` on a cycle.
    (Closures over the loop's state: a million-task flow pays for every attribute lookup.)"""
    n = len(duration_s)
    dependents: list[list[int]] = [[] for _ in range(n)]
    waiting = [len(ds) for ds in deps]
    for i, ds in enumerate(deps):
        for d in ds:
            dependents[d].append(i)
    for pairs in releases.values():
        for j, _offset in pairs:
            waiting[j] += 1
    env = simpy.Environment()
    start = [0.0] * n
    end = [0.0] * n

    def begin(j: int, now: float) -> None:
        start[j] = now
        if j in own:
            start_own(j, now)
        else:
            Timer(env, duration_s[j], j, done)
        if releases:
            for k, offset in releases.get(j, ()):
                Timer(env, offset, k, released)

    def done(event: Event) -> None:
        finish(event.value, env.now)

    def finish(i: int, now: float) -> None:
        end[i] = now
        for j in dependents[i]:
            w = waiting[j] - 1
            waiting[j] = w
            if w == 0:
                begin(j, now)

    def released(event: Event) -> None:
        k = event.value
        w = waiting[k] - 1
        waiting[k] = w
        if w == 0:
            begin(k, env.now)

    start_own = make_start(env, finish, done) if make_start is not None else None
    for i in range(n):
        if waiting[i] == 0:
            begin(i, 0.0)
    env.run()
    blocked = [i for i in range(n) if waiting[i] > 0]
    if blocked:
        raise RuntimeError(f"event flow has a cycle: {len(blocked)} tasks never became ready (e.g. {blocked[:5]})")
    return start, end


def _run_simpy(
    duration_s: Sequence[float], deps: Sequence[Sequence[int]], releases: Mapping[int, Sequence[tuple[int, float]]]
) -> EngineResult:
    return EngineResult(*simulate_events(duration_s, deps, releases))
