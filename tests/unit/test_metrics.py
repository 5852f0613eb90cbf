"""Timeline metrics (distsim.sim.metrics): worked out on paper for a hand timeline, equal to SimResult's figures for a
simulated timeline, and to what validation reports for a measured trace read back from its file."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pandas as pd
import pytest

from distsim import FlowOptions, Strategy, simulate
from distsim.io.files import load_cluster, load_model, write_json
from distsim.io.trace import Trace
from distsim.plans.result import SimResult
from distsim.sim import metrics
from distsim.sim.costs import AnalyticCosts
from distsim.sim.metrics import GPUStats
from distsim.sim.timeline import COLUMNS, Timeline
from distsim.sim.validate import validate_timelines
from tests.util import InterferingCosts, chain_model, hand_cluster, run_cli

# Two GPUs on two nodes, one iteration of 8 s (time in seconds; '=' compute, '~' communication, '.' host rows):
#
#   time          0    1    2    3    4    5    6    7    8
#   GPU 0 host    ..                                          launch 0-0.5 (not device time)
#   GPU 0 compute ==========                 =====            F0 0-1, F1 1-2, B0 6-7
#   GPU 0 p2p            ~~~~~          ~~                    send 1.5-2.5, recv 5.5-6
#   GPU 0 dp                                   ~~~~~~~        all-reduce 6.5-8
#   GPU 1 host    .....                                       launch 0-1 (not device time)
#   GPU 1 p2p            ~~~~~          ~~                    recv 1.5-2.5, send 5.5-6
#   GPU 1 compute             ===============                 F0 2.5-3.5, B0 3.5-5.5
#   GPU 1 dp                          ~~~~~~~~~~              all-reduce 5-7
#
# GPU 0: compute [0,2] + [6,7] = 3; communication [1.5,2.5] + [5.5,6] + [6.5,8] = 3; busy [0,2.5] + [5.5,8] = 5,
#        so exposed communication 5 - 3 = 2 (2-2.5, 5.5-6, 7-8) and idle 8 - 5 = 3.
# GPU 1: compute [2.5,5.5] = 3; communication [1.5,2.5] + [5,7] = 3; busy [1.5,7] = 5.5, so exposed 5.5 - 3 = 2.5
#        (1.5-2.5, 5.5-7) and idle 8 - 5.5 = 2.5.
# Bubble fraction (3 + 2.5) / (2 GPUs x 8 s) = 0.34375; mean exposed communication (2 + 2.5) / 2 = 2.25.
ROWS = [
    # gpu, stream, kind, microbatch, start, end
    (0, "host", "launch", -1, 0.0, 0.5),
    (0, "compute", "forward", 0, 0.0, 1.0),
    (0, "compute", "forward", 1, 1.0, 2.0),
    (0, "p2p", "p2p", 1, 1.5, 2.5),
    (0, "p2p", "p2p", 0, 5.5, 6.0),
    (0, "compute", "backward", 0, 6.0, 7.0),
    (0, "dp", "dp_allreduce", -1, 6.5, 8.0),
    (1, "host", "launch", -1, 0.0, 1.0),
    (1, "p2p", "p2p", 1, 1.5, 2.5),
    (1, "compute", "forward", 0, 2.5, 3.5),
    (1, "compute", "backward", 0, 3.5, 5.5),
    (1, "dp", "dp_allreduce", -1, 5.0, 7.0),
    (1, "p2p", "p2p", 0, 5.5, 6.0),
]
HAND_STATS = [GPUStats(0, 0, 3.0, 3.0, 2.0, 3.0), GPUStats(1, 1, 3.0, 3.0, 2.5, 2.5)]


def hand_frame(rows: list[tuple[int, str, str, int, float, float]] = ROWS) -> pd.DataFrame:
    gpu, stream, kind, mb, start, end = zip(*rows, strict=True)
    df = pd.DataFrame({"gpu": gpu, "node": gpu, "stream": stream, "kind": kind, "name": kind, "layer": -1,
                       "stage": gpu, "microbatch": mb, "start_s": start, "end_s": end})  # fmt: skip
    for c in ("stream", "kind", "name"):
        df[c] = df[c].astype("category")
    return df[list(COLUMNS)]


def test_hand_timeline_metrics_are_the_paper_ones() -> None:
    tl = Timeline(hand_frame(), gpus_per_node=1)
    m = metrics.of_timeline(tl)
    assert m.iteration_time_s == metrics.iteration_time(tl) == tl.iteration_time_s == 8.0
    assert m.per_gpu == HAND_STATS == metrics.gpu_stats(tl)
    assert m.bubble_fraction == metrics.bubble_fraction(m.per_gpu, 8.0) == 5.5 / 16
    assert m.exposed_comm_s == metrics.mean_exposed_comm(m.per_gpu) == 2.25
    for g in m.per_gpu:  # compute + exposed communication + idle = the iteration
        assert g.compute_s + g.exposed_comm_s + g.idle_s == 8.0
    segments = metrics.busy_segments(tl)
    assert [list(zip(*segments[g], strict=True)) for g in (0, 1)] == [[(0.0, 2.5), (5.5, 8.0)], [(1.5, 7.0)]]


def test_host_rows_lengthen_the_iteration_but_are_not_busy_time() -> None:
    """A host row after the last device row (the host's synchronize) makes the iteration 9 s: every GPU idles 1 s
    more, and nothing else changes."""
    tl = Timeline(hand_frame([*ROWS, (1, "host", "launch", -1, 8.0, 9.0)]), gpus_per_node=1)
    m = metrics.of_timeline(tl)
    assert m.iteration_time_s == 9.0
    assert [(g.compute_s, g.comm_s, g.exposed_comm_s, g.idle_s) for g in m.per_gpu] == [
        (3.0, 3.0, 2.0, 4.0),
        (3.0, 3.0, 2.5, 3.5),
    ]
    assert m.bubble_fraction == 7.5 / 18


def test_a_represented_gpu_has_the_stats_of_the_one_that_stands_for_it() -> None:
    """A simulated timeline holds only the GPUs simulated: GPUs 2 and 3 are copies of 0 and 1 (a replica), so their
    stats are 0's and 1's, and the run's figures are those of the two simulated GPUs."""
    tl = Timeline(hand_frame(), gpus_per_node=2, represents={0: (0, 2), 1: (1, 3)})
    m = metrics.of_timeline(tl)
    h0, h1 = HAND_STATS
    expected = [GPUStats(0, 0, *_figures(h0)), GPUStats(1, 0, *_figures(h1)), GPUStats(2, 1, *_figures(h0)),
                GPUStats(3, 1, *_figures(h1))]  # fmt: skip
    assert m.per_gpu == expected == metrics.gpu_stats(tl.expand())
    assert (m.bubble_fraction, m.exposed_comm_s) == (5.5 / 16, 2.25)


def test_an_empty_timeline_and_a_gpu_without_rows() -> None:
    empty = Timeline(hand_frame()[:0], gpus_per_node=1, represents={0: (0,)})
    m = metrics.of_timeline(empty)
    assert (m.iteration_time_s, m.per_gpu, m.bubble_fraction, m.exposed_comm_s) == (
        0.0, [GPUStats(0, 0, 0.0, 0.0, 0.0, 0.0)], 0.0, 0.0,
    )  # fmt: skip
    idle = Timeline(hand_frame(), gpus_per_node=1, represents={0: (0,), 1: (1,), 5: (5,)})  # GPU 5 runs nothing
    assert metrics.gpu_stats(idle)[-1] == GPUStats(5, 5, 0.0, 0.0, 0.0, 8.0)
    assert metrics.bubble_fraction([], 8.0) == metrics.mean_exposed_comm([]) == 0.0


def _figures(s: GPUStats) -> tuple[float, float, float, float]:
    return s.compute_s, s.comm_s, s.exposed_comm_s, s.idle_s


# ------------------------------------------------------------------------------------------------ simulated runs
UNIFORM = [(1.0, 2.0, 0, 500.0), (1.0, 2.0, 0, 500.0)]
SHARED = [(1.0, 2.0, 500, 500.0), (1.0, 2.0, 3000, 0.0)]
SIMULATED = {
    # name: (layers or zoo model, cluster (nodes, GPUs per node) or preset, strategy, host launch s, flow options)
    "gpipe with p2p": (UNIFORM, (1, 2), "tp=1 pp=2 dp=1 mb=3 schedule=gpipe", 0.0, {}),
    "symmetric dp x pp, wfbp": (SHARED, (1, 4), "tp=1 pp=2 dp=2 mb=2 sync=wfbp", 0.0, {}),
    "shared link": (SHARED, (2, 2), "tp=1 pp=2 dp=2 mb=1 schedule=gpipe", 0.0, {"link_sharing": "serialize"}),
    "host rows": (UNIFORM, (1, 2), "tp=1 pp=2 dp=1 mb=2 schedule=1f1b", 0.5, {"host": True}),
    "gpt2 1f1b": ("gpt2-cpu", "cpu-1x2", "tp=1 pp=2 dp=1 mb=4 schedule=1f1b partition=4:2", None, {}),
    "gpt2 tp": ("gpt2-cpu", "cpu-1x2", "tp=2 pp=1 dp=1 mb=2", None, {}),
    "gpt2 dp": ("gpt2-cpu", "cpu-1x2", "tp=1 pp=1 dp=2 mb=2", None, {}),
}


def _simulate(name: str) -> SimResult:
    layers, where, text, launch, options = SIMULATED[name]
    if isinstance(layers, str):
        cluster = load_cluster(str(where))
        model, costs = load_model(layers), AnalyticCosts(cluster)
    else:
        cluster = hand_cluster(*where)
        model, costs = chain_model(layers), InterferingCosts(cluster, launch_s=launch or 0.0)
    return simulate(model, cluster, Strategy.from_str(text), costs, FlowOptions(**options))


@pytest.mark.parametrize("name", SIMULATED)
def test_metrics_of_a_simulated_timeline_are_the_results_figures(name: str) -> None:
    """SimResult's figures come from the flow's arrays; the same functions over its timeline (as simulated, and
    expanded to every GPU) give the same numbers, exactly."""
    r = _simulate(name)
    for tl in (r.timeline, r.full_timeline()):
        m = metrics.of_timeline(tl)
        assert m.iteration_time_s == r.iteration_time_s
        assert m.per_gpu == r.per_gpu
        assert m.bubble_fraction == r.bubble_fraction
        assert m.exposed_comm_s == r.exposed_comm_s
    assert metrics.of_flow(r.flow, r.tasks.start_s, r.tasks.end_s) == metrics.of_timeline(r.timeline)
    if name == "symmetric dp x pp, wfbp":  # one replica simulated, standing for the other
        assert len(r.flow.represents) < r.num_gpus
    if name == "host rows":
        assert "launch" in set(r.timeline.df["kind"].astype(str))


# ------------------------------------------------------------------------------------------------ measured runs
def test_metrics_of_a_measured_trace_read_back_are_what_validate_reports(tmp_path: Path) -> None:
    """A measured trace written to a file and read back: the metrics of its timelines are the iteration times and
    per-iteration figures validation reports, and the predicted side's are the simulation's."""
    model, cluster = load_model("gpt2-cpu"), load_cluster("cpu-1x2")
    s = Strategy.from_str("tp=1 pp=2 dp=1 mb=4 schedule=1f1b partition=4:2")
    r = simulate(model, cluster, s, AnalyticCosts(cluster))
    base = r.full_timeline().df
    frames = []
    for k, stretch in enumerate((1.10, 0.95, 1.02)):  # three "measured" iterations, one shifted GPU in the last
        df = base.copy()
        df[["start_s", "end_s"]] *= stretch
        if k == 2:
            df.loc[df["gpu"] == 1, ["start_s", "end_s"]] += 1e-3
        frames.append(df[list(COLUMNS)].reset_index(drop=True))
    plan = {"model": "gpt2-cpu", "cluster": "cpu-1x2", "nodes": 1, "strategy": s.describe(), "p2p_blocking": False,
            "warmup": 0, "iterations": 3}  # fmt: skip
    path = tmp_path / "measured.json"
    write_json(path, Trace(plan, {}, frames).to_dict())
    trace = Trace.from_dict(json.loads(path.read_text()), str(path))
    measured = [trace.timeline(i, cluster.gpus_per_node) for i in range(len(trace.iterations))]
    ours = [metrics.of_timeline(tl) for tl in measured]

    val = validate_timelines(r.timeline, measured)
    assert val.measured_metrics == ours
    assert val.iteration_times_s == [m.iteration_time_s for m in ours] == trace.iteration_times_s
    assert val.measured_s == trace.median_iteration_s
    assert val.predicted_metrics == metrics.of_timeline(r.timeline)
    assert val.predicted_s == r.iteration_time_s
    assert [c.measured_s for c in val.comparisons] == val.iteration_times_s
    assert [c.predicted_s for c in val.comparisons] == [r.iteration_time_s] * 3
    for m, stretch in zip(ours, (1.10, 0.95), strict=False):  # a uniform stretch scales every figure
        assert m.bubble_fraction == pytest.approx(r.bubble_fraction, rel=1e-9)
        assert m.exposed_comm_s == pytest.approx(stretch * r.exposed_comm_s, rel=1e-9)
        assert m.iteration_time_s == pytest.approx(stretch * r.iteration_time_s, rel=1e-12)


def test_the_cli_reports_the_measured_metrics_of_a_shipped_trace(capsys: pytest.CaptureFixture[str]) -> None:
    """``distsim validate --json`` on a trace measured by the executor: its measured iteration times and median are
    the metrics' iteration times of the trace's timelines."""
    path = "traces/gpt2-cpu-2x1-1M2P1D-1f1b-M4.json"
    trace = Trace.from_dict(json.loads(Path(path).read_text()), path)
    code, out, err = run_cli(["validate", "--trace", path, "--samples", "0", "--json"], capsys)
    assert code == 0, err
    got = json.loads(out)
    times = [metrics.iteration_time(trace.timeline(i, 1)) for i in range(len(trace.iterations))]
    assert got["measured_iteration_s"] == times
    assert got["measured_s"] == statistics.median(times) == trace.median_iteration_s
    for i in range(len(trace.iterations)):  # a measured run's time accounting adds up as a simulated one's does
        m = metrics.of_timeline(trace.timeline(i, 1))
        for g in m.per_gpu:
            assert g.compute_s + g.exposed_comm_s + g.idle_s == pytest.approx(m.iteration_time_s, abs=1e-12)
        assert 0 <= m.bubble_fraction <= 1
