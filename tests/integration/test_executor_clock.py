"""The executor's clocks and recorder: device marks mapped onto the host clock with one anchor, blocks split around
their tp collectives, host launch rows only where the host's spans are not the device's, and a real CPU iteration
recorded without overlaps (one process, fast)."""

from __future__ import annotations

import itertools
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from distsim import Strategy, get_cluster  # noqa: E402
from distsim.core.models import get_model  # noqa: E402
from distsim.core.partition import ranges  # noqa: E402
from distsim.core.placement import Placement  # noqa: E402
from distsim.core.schedules import build_schedule  # noqa: E402
from distsim.executor.clock import Clock, HostClock, Mark, clock_for, host_times  # noqa: E402
from distsim.executor.recorder import Recorder, split_block  # noqa: E402
from distsim.executor.runtime import Runtime  # noqa: E402
from distsim.executor.worker import _assemble  # noqa: E402
from distsim.io.trace import HOST_TIMING, Trace  # noqa: E402

TINY = "gpt2-345m:seq=16,layers=2,hidden=32,heads=4,vocab=64,precision=fp32"


def test_device_marks_map_onto_the_host_clock_through_one_anchor() -> None:
    # the anchor was recorded when the host clock read 100.0 s; events 0, 2.5 and 40 ms after it on the device
    assert host_times(100.0, [0.0, 2.5, 40.0]) == pytest.approx([100.0, 100.0025, 100.04])
    assert host_times(7.25, []) == []
    # the mapping keeps the device's order and gaps: differences are the elapsed times
    t = host_times(3.0, [1.0, 1.5, 9.0])
    assert [round((b - a) * 1e3, 9) for a, b in itertools.pairwise(t)] == [0.5, 7.5]


def test_a_block_is_split_around_its_tp_collectives() -> None:
    assert split_block("forward", 1.0, 2.0, []) == [("compute", "forward", 1.0, 2.0)]
    assert split_block("backward", 1.0, 2.0, [(1.2, 1.5), (1.7, 1.8)]) == [
        ("compute", "backward", 1.0, 1.2), ("tp", "tp_allreduce", 1.2, 1.5), ("compute", "backward", 1.5, 1.7),
        ("tp", "tp_allreduce", 1.7, 1.8), ("compute", "backward", 1.8, 2.0),
    ]  # fmt: skip
    # a block that starts and ends with its collective: no empty compute rows
    assert split_block("forward", 1.0, 1.5, [(1.0, 1.5)]) == [("tp", "tp_allreduce", 1.0, 1.5)]


class _Done:
    """A completed asynchronous operation (torch's own Future), as a torch.distributed work handle exposes it."""

    def __init__(self) -> None:
        self.future: Any = torch.futures.Future()
        self.waited = False

    def get_future(self) -> Any:
        return self.future

    def wait(self) -> bool:
        self.waited = True
        return True


def test_host_clock_marks_now_and_settles_a_completion_when_the_work_completes_or_is_waited() -> None:
    clock = clock_for(torch.device("cpu"))
    assert isinstance(clock, HostClock) and not clock.host_rows
    start = clock.begin()
    a = clock.mark()
    early, late = _Done(), _Done()
    done_early = clock.completion(early)
    done_late = clock.completion(late)
    early.future.set_result(None)  # completes now: its callback sets the mark
    b = clock.mark()
    clock.wait(late, done_late)  # never completed by callback: waiting settles it
    assert late.waited
    clock.wait(early, done_early)  # already settled: waiting does not move it
    end, t = clock.finish()
    assert start <= t[a] <= t[done_early] <= t[b] <= t[done_late] <= end
    assert len(t) == 4 and clock.describe()["device_clock"] == "perf_counter"
    clock.begin()
    assert clock.mark() == 0  # every iteration starts afresh


class _GivenClock(Clock):
    """A clock whose device times are given (ms after an anchor at host time 10 s) and whose host clock ticks 1 ms
    per reading, so host spans differ from device spans, as on a GPU: the recorder's resolution and host rows with
    hand numbers."""

    name = "given"
    host_rows = True

    def __init__(self, device_ms: list[float]) -> None:
        self.device_ms = device_ms
        self.used = 0
        self.host = 10.0

    def now(self) -> float:
        self.host += 0.001
        return self.host

    def begin(self) -> float:
        self.used = 0
        return 10.0

    def mark(self) -> Mark:
        self.used += 1
        return self.used - 1

    def finish(self) -> tuple[float, list[float]]:
        return 10.5, host_times(10.0, self.device_ms[: self.used])

    def describe(self) -> dict[str, Any]:
        return {"device_clock": self.name}


def test_the_recorder_resolves_marks_after_the_iteration_and_keeps_host_launch_spans() -> None:
    # device: block 0-100 ms with a tp all-reduce 40-60 ms; optimizer 200-300 ms; send 300-350 ms; recv mark 400 ms
    rec = Recorder(_GivenClock([0.0, 40.0, 60.0, 100.0, 200.0, 300.0, 300.0, 350.0, 400.0]))
    rec.begin(3)
    with rec.block("forward", "layer0.attention", 1, 0, 2):
        rec.collective(rec.clock.mark(), rec.clock.mark())
    [(it, row)] = rec.rows  # the host's span is known at once, the device's only after the iteration
    assert it == 3 and row[:6] == ("host", "launch", "layer0.attention", 1, 0, 2)
    assert row[6:] == pytest.approx((10.001, 10.002))
    with rec.span("compute", "optimizer", "optimizer step", -1, 0, -1):
        pass
    start = rec.clock.mark()
    rec.send(("key",), ("p2p", "p2p", "act 0->1", -1, 0, 2), start, rec.clock.mark(), (10.01, 10.02))
    rec.received(("other",), rec.clock.mark())
    assert rec.finish(stage=0) == 10.5
    device = sorted(r for it, r in rec.rows if r[0] != "host")
    assert [r[:2] for r in device] == [("compute", "forward"), ("compute", "forward"), ("compute", "optimizer"),
                                       ("tp", "tp_allreduce")]  # fmt: skip
    assert [t for r in device for t in r[6:]] == pytest.approx([10.0, 10.04, 10.06, 10.1, 10.2, 10.3, 10.04, 10.06])
    host = [r for it, r in rec.rows if r[0] == "host"]
    assert [r[1:3] for r in host] == [("launch", "layer0.attention"), ("launch", "optimizer step"),
                                      ("launch", "act 0->1"), ("launch", "synchronize")]  # fmt: skip
    times = [t for r in host for t in r[6:]]
    assert times == pytest.approx([10.001, 10.002, 10.003, 10.004, 10.01, 10.02, 10.005, 10.5])  # the wait ends it
    assert rec.p2p_sends == [(3, ("key",), ("p2p", "p2p", "act 0->1", -1, 0, 2, 10.3, 10.35))]
    assert rec.p2p_recvs == [(3, ("other",), 10.4)]
    assert {it for it, _ in rec.rows} == {3} and rec.iteration_starts == {3: 10.0}
    gathered = pickle.loads(pickle.dumps(rec))  # what rank 0 gathers: rows, not the clock
    assert gathered.rows == rec.rows and not hasattr(gathered, "clock")


def test_assembly_shifts_ranks_to_the_iteration_start_and_ends_a_transfer_at_its_receiver() -> None:
    sender, receiver = Recorder(), Recorder()
    sender.iteration_starts = {0: 5.0}
    receiver.iteration_starts = {0: 105.2}  # another host: its clock reads 100 s more
    key = (0, 1, "F", 0, 0, 0)
    sender.rows = [(0, ("host", "launch", "embedding", 0, 0, 0, 5.1, 5.2)),
                   (0, ("compute", "forward", "embedding", 0, 0, 0, 5.1, 5.4))]  # fmt: skip
    sender.p2p_sends = [(0, key, ("p2p", "p2p", "act 0->1", -1, 0, 0, 5.4, 5.5))]
    receiver.p2p_recvs = [(0, key, 105.9)]
    [df] = _assemble([(0, sender, []), (1, receiver, [])], {0: 0.0, 1: 100.0}, 0, 1, gpus_per_node=1)
    rows = {(r.stream, r.kind): (r.gpu, r.node, r.start_s, r.end_s) for r in df.itertuples()}
    assert rows[("host", "launch")] == pytest.approx((0, 0, 0.1, 0.2))
    assert rows[("compute", "forward")] == pytest.approx((0, 0, 0.1, 0.4))
    assert rows[("p2p", "p2p")] == pytest.approx((0, 0, 0.4, 0.9))  # until the receiver has the data
    receiver.p2p_recvs = [(0, key, 105.45)]  # received before the sender's device finished: the sender's end
    [df] = _assemble([(0, sender, []), (1, receiver, [])], {0: 0.0, 1: 100.0}, 0, 1, gpus_per_node=1)
    assert df[df["kind"] == "p2p"][["start_s", "end_s"]].to_numpy().ravel().tolist() == pytest.approx([0.4, 0.5])


def test_a_cpu_iteration_records_every_block_without_host_rows_or_overlaps() -> None:
    model, cluster = get_model(TINY), get_cluster("cpu-1x2")
    strategy = Strategy(micro_batch_size=2, num_micro_batches=3, partition=(model.num_layers,))
    one = cluster.with_nodes(1).__class__(**{**cluster.__dict__, "nodes": 1, "gpus_per_node": 1, "slowdown": ()})
    device = torch.device("cpu")
    runtime = Runtime(model, strategy, Placement(strategy, one), build_schedule(strategy), ranges(strategy.partition),
                      0, {}, torch.float32, device)  # fmt: skip
    for it in range(2):
        runtime.run_iteration(it, lambda: None)
        runtime.zero_grad()
    rec = runtime.recorder
    assert len(runtime.losses) == 2 * 3 and all(isinstance(x, float) for x in runtime.losses)
    assert not runtime.data and not runtime.loss_values  # every prefetched batch was used, every loss read
    rows = [(it, r) for it, r in rec.rows]
    assert {r[0] for _, r in rows} == {"compute"}  # CPU: no host stream (its spans are the compute rows)
    blocks = sum(len(layer.blocks) for layer in model.layers)
    for it in range(2):
        mine = sorted(r[6:] for i, r in rows if i == it)
        assert len(mine) == 2 * 3 * blocks + 1  # forward and backward of every block and micro-batch, the optimizer
        assert all(s <= e for s, e in mine)
        assert all(e <= s2 for (_, e), (s2, _) in itertools.pairwise(mine))  # one stream, no overlap
        assert rec.iteration_starts[it] <= mine[0][0]
    assert [r[1] for _, r in rows].count("optimizer") == 2


def test_traces_record_their_timing_and_older_ones_read_as_host_timed(tmp_path: Path) -> None:
    shipped = json.loads(Path("traces/gpt2-cpu-1x2-1M2P1D-1f1b-M4.json").read_text())
    assert Trace.from_dict(shipped).provenance["timing"]["device_clock"] == "perf_counter"  # shipped: recorded now
    shipped["provenance"].pop("timing")  # as traces recorded before the executor said how it timed
    old = Trace.from_dict(shipped)
    assert "timing" not in old.provenance and old.timing == HOST_TIMING and not old.host_timed_gpu
    gpu_old = Trace(old.plan, {**old.provenance, "threads_per_rank": None, "backend": "none"}, old.iterations)
    assert gpu_old.host_timed_gpu  # a GPU run before CUDA events: per-event times are launch spans
    timing = clock_for(torch.device("cpu")).describe()
    new = Trace(old.plan, {**gpu_old.provenance, "timing": {**timing, "device_clock": "cuda_event"}}, old.iterations)
    assert not Trace.from_dict(json.loads(json.dumps(new.to_dict()))).host_timed_gpu


def test_validate_compares_device_spans_counts_host_rows_in_the_iteration_and_notes_host_timed_gpu_traces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pandas as pd

    from distsim.io.files import load_cluster, load_model, write_json
    from distsim.plans.simulate import simulate
    from distsim.sim.costs import AnalyticCosts
    from distsim.sim.timeline import COLUMNS
    from tests.util import run_cli

    model, cluster = load_model("gpt2-cpu"), load_cluster("cpu-1x2")
    strategy = Strategy.from_str("tp=1 pp=2 dp=1 mb=4 schedule=1f1b partition=4:2")
    df = simulate(model, cluster, strategy, AnalyticCosts(cluster)).timeline.expand().df
    t = float(df["end_s"].max())
    # each GPU's host: launches ahead of its device, then the final wait, until 10 % after the device's last event
    host = pd.DataFrame([(g, 0, "host", "launch", name, -1, 0, -1, s, e) for g in (0, 1)
                         for name, s, e in (("layer0.attention", 0.0, 0.001 * t), ("synchronize", 0.5 * t, 1.1 * t))],
                        columns=list(COLUMNS))  # fmt: skip
    measured = pd.concat([df[list(COLUMNS)], host], ignore_index=True)
    plan = {"model": "gpt2-cpu", "cluster": "cpu-1x2", "nodes": 1, "strategy": strategy.describe(),
            "p2p_blocking": False, "warmup": 0, "iterations": 1}  # fmt: skip
    timing = {**clock_for(torch.device("cpu")).describe(), "device_clock": "cuda_event", "host_rows": True}
    for name, provenance in (("old", {"threads_per_rank": None}), ("new", {"threads_per_rank": None,
                                                                            "timing": timing})):  # fmt: skip
        path = tmp_path / f"{name}.json"
        write_json(path, Trace(plan, provenance, [measured]).to_dict())
        code, out, err = run_cli(["validate", "--trace", str(path), "--samples", "0", "--json"], capsys)
        assert code == 0, err
        got = json.loads(out)
        assert got["measured_s"] == pytest.approx(1.1 * t)  # the host's wall time, to its final synchronize
        assert set(got["per_gpu_error"].values()) == {0.0}  # events compared by their device spans only
        assert got["host_timed_gpu"] == (name == "old")
        code, out, err = run_cli(["validate", "--trace", str(path), "--samples", "0"], capsys)
        assert code == 0 and ("timed by the host clock" in out + err) == (name == "old"), err
