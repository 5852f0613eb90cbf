"""The host stream: each GPU's host enqueues its kernels in program order, a kernel starts no earlier than its
launch ends, and the host waits for received data and for the gradients before the optimizer step.

Golden cases use given times (seconds) on the hand cluster, so every figure below is worked out in the docstring.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given

from distsim import FlowOptions, Strategy, simulate
from tests.unit.test_invariants import SETTINGS, Scenario, _run, scenarios
from tests.util import InterferingCosts, chain_model, hand_cluster

HOST = FlowOptions(host=True)


def _one_gpu(launch: float) -> float:
    model = chain_model([(1.0, 2.0, 0, 0.0)] * 2)  # two layers, F 1 s, B 2 s, no parameters (no optimizer step)
    cluster = hand_cluster(1, 1)
    r = simulate(model, cluster, Strategy(), InterferingCosts(cluster, launch_s=launch), HOST)
    return r.iteration_time_s


def test_a_launch_bound_chain_waits_for_its_host() -> None:
    """Launch 3 s per kernel. Host: F launches end at 3 and 6; B launches (the host runs on) at 9 and 12.
    GPU: F0 3-4, F1 6-7, B1 9-11 (after F1 and its launch), B0 12-14. Without the host: 6 s."""
    assert _one_gpu(3.0) == pytest.approx(14.0)
    assert _one_gpu(0.0) == pytest.approx(6.0)


def test_a_gpu_bound_chain_pays_only_the_first_launch() -> None:
    """Launch 0.1 s: F0 0.1-1.1, then each kernel waits for the one before (launched long ago): 0.1 + 6."""
    assert _one_gpu(0.1) == pytest.approx(6.1)


def test_the_host_waits_for_received_data() -> None:
    """Two stages, one layer each (F 1, B 2), launch 0.5, free transfers. Stage 0: host 0-0.5, F 0.5-1.5, send.
    Stage 1: its host waits for the activation (1.5), launches 1.5-2.0, F 2.0-3.0; launches B 2.0-2.5, B 3.0-5.0,
    sends the gradient. Stage 0's host waits for it (5.0), launches 5.0-5.5, B 5.5-7.5. Without the host: 6."""
    model = chain_model([(1.0, 2.0, 0, 0.0)] * 2)
    cluster = hand_cluster(1, 2)
    costs = InterferingCosts(cluster, launch_s=0.5)
    r = simulate(model, cluster, Strategy(pp=2), costs, HOST)
    assert r.iteration_time_s == pytest.approx(7.5)
    df = r.timeline.df
    host = df[df["stream"].astype(str) == "host"].sort_values(["gpu", "start_s"])
    spans = [x for row in host[["gpu", "start_s", "end_s"]].values.tolist() for x in row]
    assert spans == pytest.approx([0, 0.0, 0.5, 0, 5.0, 5.5, 1, 1.5, 2.0, 1, 2.0, 2.5])
    gpu0 = r.per_gpu[0]
    assert gpu0.compute_s == pytest.approx(3.0) and gpu0.idle_s == pytest.approx(4.5)  # host rows are not busy time
    without = simulate(model, cluster, Strategy(pp=2), costs, FlowOptions(host=False))
    assert without.iteration_time_s == pytest.approx(6.0)


def test_the_optimizer_step_waits_for_the_gradients_and_its_launch() -> None:
    """One layer (F 1, B 2) with parameters, dp=2, launch 0.5 (a kernel): F 0.5-1.5, B 1.5-3.5, all-reduce of 1000
    gradient bytes over 2 (1 s) 3.5-4.5; the host waits for it, launches the step 4.5-5.0, the step starts at 5.0."""
    model = chain_model([(1.0, 2.0, 500, 0.0)])  # 500 params: 1000 gradient bytes, all-reduce over 2: 1 s
    cluster = hand_cluster(1, 2)
    cluster = replace(cluster, gpu=replace(cluster.gpu, kernel_launch_s=0.5))
    costs = InterferingCosts(cluster, launch_s=0.5)
    r = simulate(model, cluster, Strategy(dp=2), costs, HOST)
    df = r.timeline.df
    allreduce_end = float(df[df["kind"].astype(str) == "dp_allreduce"]["end_s"].max())
    step = df[(df["kind"].astype(str) == "optimizer") & (df["gpu"] == 0)]
    assert allreduce_end == pytest.approx(4.5) and float(step["start_s"].iloc[0]) == pytest.approx(5.0)


@SETTINGS
@given(scenarios())
def test_every_kernel_starts_after_its_launch(sc: Scenario) -> None:
    """Release constraints hold in the executed flow, and host tasks of one GPU never overlap."""
    r = _run(sc, options=replace(sc.options, host=True), launch_s=max(sc.launch_s, 0.01))
    for host, pairs in r.flow.releases.items():
        for task, offset in pairs:
            assert r.tasks.start_s[task] >= r.tasks.start_s[host] + offset - 1e-9


@SETTINGS
@given(scenarios())
def test_launching_faster_is_never_slower(sc: Scenario) -> None:
    opts = replace(sc.options, host=True)
    slow = _run(sc, options=opts, launch_s=0.2).iteration_time_s
    fast = _run(sc, options=opts, launch_s=0.05).iteration_time_s
    none = _run(sc, options=opts, launch_s=0.0).iteration_time_s
    assert none <= fast + 1e-9 and fast <= slow + 1e-9


def test_host_off_by_default_without_launch_costs() -> None:
    model = chain_model([(1.0, 2.0, 0, 0.0)] * 2)
    cluster = hand_cluster(1, 1)
    r = simulate(model, cluster, Strategy())
    assert "host" not in set(r.timeline.df["stream"].astype(str))
    with_launch = replace(cluster, gpu=replace(cluster.gpu, kernel_launch_s=1e-6))
    r = simulate(model, with_launch, Strategy())
    assert "host" in set(r.timeline.df["stream"].astype(str))
