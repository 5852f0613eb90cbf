"""Shared network resources in time: inter-node transfers share each node's NICs while, and only while, they overlap.

With fair link sharing (``FlowOptions.link_sharing = "fair"``) the flow records, for every communication task that
crosses nodes, a :class:`NetUse`: the NIC sets it sends and receives through (resource ``2 n`` is node n's NICs
sending, ``2 n + 1`` receiving; full duplex, so the two directions do not compete), its bytes on the wire at each
(what its algorithm moves per rank: 2(n-1)/n B for a ring all-reduce of B bytes over n ranks, B for a transfer), a
fixed latency part, and the rate it gets alone. Its duration in the flow is its cost alone.

:func:`run_shared` executes the flow as a SimPy discrete-event simulation in which those tasks are *flows on shared
resources* (processor sharing). Each node's NICs in each direction carry ``capacity`` bytes/s (NICs per node x one
NIC's bandwidth), divided equally among the network tasks using them at that moment; a task moves its bytes at the
least of its resources' shares, and never faster than one flow can go (one NIC for a transfer; a collective, striped
over all of a node's NICs, no faster than the intra-node link can feed them). Rates are recomputed whenever a
network task starts or finishes its bytes; a task ends when its bytes are done plus its latency part. With k tasks
overlapping for their whole lives this gives each the cost the ``structural`` mode gives k symmetric sharers
(:meth:`distsim.core.cluster.Cluster.inter_collective_bandwidth`, ``inter_flow_bandwidth``), and a task alone
throughout takes exactly its duration (``start + duration``, to the last bit, as :func:`distsim.sim.engine.run`). Every
other task (compute, intra-node communication, host launches) runs as in :func:`distsim.sim.engine.run_simpy`.

A symmetric flow simulates one instance of each pattern for all of them: a network task then counts, on each
resource, every instance of its pattern that uses it (``NetUse.usage``), which is exact when all instances see the
same load (:func:`distsim.core.placement.shares_evenly`; the flow builder checks it, else simulates every GPU).

Stream orders are fixed by the flow builder as before, so nothing is arbitrated; but durations now depend on the
timeline, and processor sharing admits anomalies (more bandwidth can let a non-critical transfer start earlier and
overlap a critical one), so the iteration time is not guaranteed monotone in bandwidth. The result is still the
longest path of the durations the run realised (tested).

:func:`run_flow` picks the engine: the shared one where the flow records network tasks, else the one-pass longest
path (equal on flows where nothing is shared, tested).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import simpy
from simpy.events import Event

from distsim.sim.engine import EngineResult, Timer, paused_gc, run, simulate_events


@dataclass(frozen=True)
class NetUse:
    """How one network task uses the nodes' NICs."""

    usage: tuple[tuple[int, int], ...]
    """(resource, instances): resource ``2 n`` is node n's NICs sending, ``2 n + 1`` receiving; instances: how many
    copies of the task load it (1, or in a symmetric flow every instance of its pattern that uses it)."""
    latency_s: float
    """The fixed part of its duration (per-step latencies), paid after its bytes are done; not shared."""
    wire_bytes: float
    """Bytes it moves through each of its NIC sets (at :attr:`rate` alone it takes its duration minus the latency)."""
    rate: float
    """Bytes/s it gets alone (one copy, nothing else on its NICs)."""
    max_rate: float
    """Bytes/s one copy can take at most, whatever its NICs' shares (one NIC for a transfer)."""


@dataclass(frozen=True)
class SharedResult(EngineResult):
    slowed: frozenset[int] = frozenset()
    """Network tasks that shared a resource for some positive time (those not in it took exactly their duration)."""


def run_flow(flow: Any, duration_s: Sequence[float] | None = None) -> EngineResult:
    """Execute an event flow (its durations, or `duration_s`): :func:`run_shared` where it records network tasks
    (fair link sharing), else the longest path."""
    durations = flow.duration_s if duration_s is None else duration_s
    if flow.network:
        cluster = flow.cluster
        capacity = cluster.inter.bandwidth_bytes_per_s * cluster.nics_per_node
        return run_shared(durations, flow.deps, flow.releases, flow.network, capacity)
    return run(durations, *flow.compact())


def run_shared(
    duration_s: Sequence[float],
    deps: Sequence[Sequence[int]],
    releases: Mapping[int, Sequence[tuple[int, float]]] | None,
    network: Mapping[int, NetUse],
    capacity: float,
) -> SharedResult:
    """Execute tasks `0..n-1` as :func:`distsim.sim.engine.run` does, the tasks in `network` as flows sharing the
    nodes' NICs (`capacity` bytes/s per node and direction); see the module docstring. Raises ``RuntimeError`` on a
    cycle."""
    if not capacity > 0:
        raise ValueError(f"NIC capacity must be > 0, got {capacity!r}")
    with paused_gc():
        return _run_shared(duration_s, deps, releases or {}, network, capacity)


def _run_shared(
    duration_s: Sequence[float],
    deps: Sequence[Sequence[int]],
    releases: Mapping[int, Sequence[tuple[int, float]]],
    network: Mapping[int, NetUse],
    capacity: float,
) -> SharedResult:
    """:func:`run_shared`'s simulation: the engine's event loop, the network tasks started by :class:`_Network`."""
    slowed: set[int] = set()

    def make_start(env: simpy.Environment, finish: Callable[[int, float], None],
                   done: Callable[[Event], None]) -> Callable[[int, float], None]:  # fmt: skip
        return _Network(env, duration_s, network, capacity, slowed, finish, done).join

    start, end = simulate_events(duration_s, deps, releases, network, make_start)
    return SharedResult(start, end, frozenset(slowed))


class _Network:
    """The state of the tasks moving bytes: per resource its load (copies of tasks on it) and its users; per task
    the work left (seconds at its alone rate) as of `since`, its speed (rate over alone rate) since then, and the
    version of its scheduled byte completion (older ones are stale)."""

    def __init__(
        self, env: simpy.Environment, duration_s: Sequence[float], network: Mapping[int, NetUse], capacity: float,
        slowed: set[int], finish: Callable[[int, float], None], done: Callable[[Event], None],
    ) -> None:  # fmt: skip
        self.env, self.duration_s, self.network, self.capacity = env, duration_s, network, capacity
        self.slowed, self.finish, self.done = slowed, finish, done
        self.load: dict[int, int] = {}
        self.users: dict[int, set[int]] = {}
        self.left: dict[int, float] = {}
        self.since: dict[int, float] = {}
        self.speed: dict[int, float] = {}
        self.version: dict[int, int] = {}

    def join(self, j: int, now: float) -> None:
        """Network task j starts moving its bytes: it loads its resources and every task on them is re-rated. Its
        end, should it never be slowed, is scheduled now: start + duration, exactly."""
        use = self.network[j]
        dur = self.duration_s[j]
        work = max(0.0, dur - use.latency_s)
        self.left[j], self.since[j], self.speed[j], self.version[j] = work, now, 1.0, 0
        for r, copies in use.usage:
            self.load[r] = self.load.get(r, 0) + copies
            self.users.setdefault(r, set()).add(j)
        Timer(self.env, dur, j, self.unslowed_end)
        Timer(self.env, work, (j, 0), self.bytes_end)
        self.rerate(use, now)

    def rerate(self, use: NetUse, now: float) -> None:
        """Recompute the speeds of the tasks on `use`'s resources; reschedule the byte completion of those that
        change."""
        load, speed, left, since = self.load, self.speed, self.left, self.since
        tasks: set[int] = set()
        for r, _copies in use.usage:
            tasks |= self.users[r]
        for t in sorted(tasks):  # sorted: the run does not depend on set order
            u = self.network[t]
            rate = u.max_rate
            for r, _copies in u.usage:
                share = self.capacity / load[r]
                if share < rate:
                    rate = share
            s = 1.0 if rate >= u.rate else rate / u.rate
            old = speed[t]
            if s == old:
                continue
            elapsed = now - since[t]
            if elapsed > 0:
                left[t] = max(0.0, left[t] - old * elapsed)
                if old < 1.0:
                    self.slowed.add(t)
            since[t], speed[t] = now, s
            v = self.version[t] = self.version[t] + 1
            Timer(self.env, left[t] / s, (t, v), self.bytes_end)

    def leave(self, t: int, now: float) -> None:
        """Task t's bytes are done: it leaves its resources, and the tasks left on them are re-rated."""
        if self.speed[t] < 1.0 and now > self.since[t]:
            self.slowed.add(t)
        use = self.network[t]
        for r, copies in use.usage:
            self.load[r] -= copies
            self.users[r].discard(t)
        del self.left[t], self.since[t], self.speed[t], self.version[t]
        self.rerate(use, now)

    def bytes_end(self, event: Event) -> None:
        t, v = event.value
        if self.version.get(t) != v:  # rescheduled since, or ended
            return
        self.leave(t, self.env.now)
        if t in self.slowed:  # else its end, start + duration, is already scheduled
            Timer(self.env, self.network[t].latency_s, t, self.done)

    def unslowed_end(self, event: Event) -> None:
        """start + duration of a network task: its end unless it was slowed (then its bytes decide)."""
        t = event.value
        now = self.env.now
        if t in self.version:  # still moving bytes: its work rounded to an ulp past its duration, or it was slowed
            if self.speed[t] < 1.0 and now > self.since[t]:
                self.slowed.add(t)
            if t in self.slowed:
                return
            self.leave(t, now)
        if t not in self.slowed:
            self.finish(t, now)
