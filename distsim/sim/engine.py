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
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
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
object instead of a list per op: a large flow is mostly such ops. :func:`run` reads it; the flow expands it for
every other reader."""


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


@dataclass(frozen=True)
class EngineResult:
    start_s: list[float]
    end_s: list[float]

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
    starts (a kernel is not started before the host has enqueued it). A dependency list may be :data:`PREV` and a
    release list may hold :class:`ChainRelease` items (an event flow's compact form). Raises ``RuntimeError`` on a
    cycle."""
    n = len(duration_s)
    after: list[list[tuple[int, float]] | None] = [None] * n  # task -> (host task, offset) of its releases
    for h, pairs in (releases or {}).items():
        for item in pairs:
            if type(item) is ChainRelease:
                first, base, ends = item.first, item.base, item.ends
                for i in item.indices:
                    got = after[first + i]
                    if got is None:
                        after[first + i] = [(h, base + ends[i])]
                    else:
                        got.append((h, base + ends[i]))
            else:
                j, offset = item  # type: ignore[misc]
                got = after[j]
                if got is None:
                    after[j] = [(h, offset)]
                else:
                    got.append((h, offset))
    start = [0.0] * n
    end = [0.0] * n
    if not _in_id_order(duration_s, deps, after, start, end):
        _longest_path(_topological_order(n, deps, after), duration_s, deps, after, start, end)
    return EngineResult(start, end)


def _in_id_order(
    duration_s: Sequence[float],
    deps: Sequence[Sequence[int]],
    after: Sequence[Sequence[tuple[int, float]] | None],
    start: list[float],
    end: list[float],
) -> bool:
    """Fill `start` and `end` task by task in id order, the order every builder adds tasks in; False (and stop) at a
    task that waits for a later one (the caller then sorts them: :func:`_topological_order`)."""
    prev = PREV
    for j in range(len(duration_s)):
        ds = deps[j]
        if ds is prev:  # the task before it alone, which ended at or after 0
            s = end[j - 1]
        else:
            s = 0.0
            for d in ds:
                if d >= j:
                    return False
                e = end[d]
                if e > s:
                    s = e
        released = after[j]
        if released is not None:
            for h, offset in released:
                if h >= j:
                    return False
                t = start[h] + offset
                if t > s:
                    s = t
        start[j] = s
        end[j] = s + duration_s[j]
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
        s = end[j - 1] if ds is prev else max((end[d] for d in ds), default=0.0)
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
        preds = ([j - 1] if deps[j] is PREV else list(deps[j])) + [h for h, _ in after[j] or ()]
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
