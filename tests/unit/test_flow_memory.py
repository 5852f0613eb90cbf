"""A full flow's compact storage (issue 24: ``simulate --full`` at 8,192 GPUs in under 4 GB) changes nothing that is
read from it: it expands to exactly the dependencies, releases and slots that plain lists give, and runs to the same
times bit for bit; and it stays small per task (measured with tracemalloc, with a generous bound, never the clock)."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

from distsim import AnalyticCosts, get_cluster, get_model
from distsim.core.strategy import Strategy
from distsim.sim import engine, metrics, network
from distsim.sim.engine import Releases, paused_gc
from distsim.sim.flow.events import EventFlow, FlowOptions
from distsim.sim.flow.uniform import build_flow


def plain_add(self: EventFlow, dur: float, slots: tuple[tuple[int, int], ...], kind: int, name: str, layer: int,
              stage: int, mb: int, key: int, deps: list[int]) -> int:  # fmt: skip
    """:meth:`EventFlow.add` as it stored every task before: its full dependency list."""
    tid = len(self.duration_s)
    for slot in slots:
        prev = self._last.get(slot)
        if prev is not None and prev not in deps:
            deps.append(prev)
        self._last[slot] = tid
    self._deps.append(deps)
    columns = (self.duration_s, self.slots, self.kind, self.name, self.layer, self.stage, self.microbatch, self.key)
    for column, value in zip(columns, (dur, slots, kind, name, layer, stage, mb, key), strict=True):
        column.append(value)
    self.slot_code.append(self._code(slots))
    return tid


def plain_release(self: EventFlow, host_task: int, task: int, offset_s: float) -> None:
    """:meth:`EventFlow.release` as it stored every pair before: a tuple in a list."""
    got = self._releases.get(host_task)
    if got is None:
        got = self._releases[host_task] = []
    got.append((task, offset_s))  # type: ignore[union-attr]
    self._expanded = None


def full_flow(strategy: str = "8M4P2D", nodes: int = 8, micro_batches: int = 8, **options: Any) -> EventFlow:
    model, cluster = get_model("gpt3-175b"), get_cluster("dgx-a100").with_nodes(nodes)
    with paused_gc():
        return build_flow(model, cluster, Strategy.from_str(strategy, num_micro_batches=micro_batches),
                          AnalyticCosts(cluster), FlowOptions(symmetric=False, **options))  # fmt: skip


@pytest.mark.parametrize("options", [{}, {"link_sharing": "serialize"}, {"host": False}, {"exact_host": True}])
def test_a_full_flow_expands_to_the_plain_lists_and_runs_to_the_same_times(
    monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    compact = full_flow(**options)
    with monkeypatch.context() as m:
        m.setattr(EventFlow, "add", plain_add)
        m.setattr(EventFlow, "release", plain_release)
        plain = full_flow(**options)
    assert any(type(d) is int for d in compact._deps)  # the compact forms are exercised
    assert all(type(d) is list for d in plain._deps)
    assert compact.deps == plain.deps
    assert compact.releases == plain.releases
    assert list(compact.slots) == list(plain.slots)
    for column in ("duration_s", "kind", "name", "layer", "stage", "microbatch", "key"):
        assert list(getattr(compact, column)) == list(getattr(plain, column)), column
    got, want = network.run_flow(compact), network.run_flow(plain)
    monkeypatch.setattr(engine, "LARGE", 0)  # times as arrays
    large = network.run_flow(compact)
    assert isinstance(large.start_s, engine.Times) and large == got == want
    assert list(got.start_s) == list(want.start_s) and list(got.end_s) == list(want.end_s)  # bit for bit
    assert metrics.flow_stats(compact, got.start_s, got.end_s) == metrics.flow_stats(plain, want.start_s,
                                                                                     want.end_s)  # fmt: skip


def test_a_full_flow_and_its_run_take_little_memory_per_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 58,592-task full flow, run as a large one (times as arrays: :data:`~distsim.sim.engine.LARGE`): about 125
    bytes a task built, 170 at the peak of its run and stats (with a list or a tuple per task: 450 and 670). The
    bounds leave room, so that only a return to per-task containers fails."""
    monkeypatch.setattr(engine, "LARGE", 0)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        flow = full_flow()
        built = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.reset_peak()
        result = network.run_flow(flow)
        metrics.flow_stats(flow, result.start_s, result.end_s)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    n = len(flow)
    assert n > 50_000
    assert built / n < 300, f"{built / n:.0f} bytes per task"
    assert peak / n < 400, f"{peak / n:.0f} bytes per task at the peak"


def test_the_engine_reads_the_compact_forms_in_any_order() -> None:
    """An int dependency and a :class:`Releases` list, in id order and (a task released by a later host task) out
    of it, where the engine sorts the tasks first: the times of the plain lists, which SimPy gives too."""
    released = Releases()
    released.append((0, 0.5))
    durations = [1.0, 2.0, 0.25]
    later = engine.run(durations, [[], 0, []], {2: released})
    assert later.start_s == [0.5, 1.5, 0.0] and later.end_s == [1.5, 3.5, 0.25]
    assert later == engine.run_simpy(durations, [[], [0], []], {2: [(0, 0.5)]})
    released = Releases()
    released.append((2, 0.5))
    in_order = engine.run([0.25, 1.0, 2.0], [[], 0, []], {0: released})
    assert in_order.start_s == [0.0, 0.25, 0.5] and in_order.end_s == [0.25, 1.25, 2.5]
