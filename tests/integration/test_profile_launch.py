"""The profile's host launch times on CPU: storage and costs; the host's speed per eager operator, and the host time
per kernel the profiler derives from measured launch times.

The CUDA timing path (FedTimer: sleep kernel, L2 sweep, host enqueue time) needs a GPU and is not exercised here."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from distsim.core.cluster import get_cluster  # noqa: E402
from distsim.core.models.graph import FP32  # noqa: E402
from distsim.core.models.transformer import mlp_block  # noqa: E402
from distsim.core.strategy import Strategy  # noqa: E402
from distsim.io.files import load_model, load_profile, write_json  # noqa: E402
from distsim.profiler.compute import EVICT_BYTES, evict_bytes, time_compute_event  # noqa: E402
from distsim.profiler.host import measure_host_op_costs  # noqa: E402
from distsim.search.discovery import discover  # noqa: E402
from distsim.sim.costs import AnalyticCosts, ComputeEvent, Cost, ProfileCosts  # noqa: E402
from distsim.sim.profile_db import Measurement, ProfileDB  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MLP = ComputeEvent(mlp_block(32, 64, 8, FP32), "F", 1, 1, "fp32")


@pytest.mark.parametrize("phase", ["F", "B"])
def test_cpu_timing_is_unchanged_and_has_no_launch_time(phase: str) -> None:
    """On CPU the host runs the work: no launch time is recorded; the sweep stays EVICT_BYTES."""
    timing = time_compute_event(replace(MLP, phase=phase), "cpu", warmup=1, repeats=3)
    assert timing.launch_s is None and timing.starved == 0
    assert len(timing.samples_s) == 3 and all(t > 0 for t in timing.samples_s)
    assert evict_bytes("cpu") == EVICT_BYTES


def test_launch_time_and_ratio_round_trip_through_the_profile_database(tmp_path: Path) -> None:
    db = ProfileDB(
        provenance={"device": "dev"},
        compute={
            "new": Measurement(1e-3, 9e-4, 1.2e-3, 3, 1e9, 1.1e-3, (1e-3, 1.1e-3, 1.2e-3), 2.5e-4, 1.05),
            "old": Measurement(2e-3, mean_s=2.1e-3),
        },
    )
    path = tmp_path / "p.json"
    write_json(path, db.to_dict())
    raw = json.loads(path.read_text())
    assert raw["compute"]["new"]["launch_s"] == 2.5e-4 and raw["compute"]["new"]["insitu_ratio"] == 1.05
    assert "launch_s" not in raw["compute"]["old"] and "insitu_ratio" not in raw["compute"]["old"]
    back = load_profile(path)
    assert back.compute == db.compute
    merged = back.merge(ProfileDB(provenance={"device": "dev"}, compute={"other": Measurement(1e-3)}))
    assert merged.compute["new"].launch_s == 2.5e-4  # extending a profile keeps what it had


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "x"])
def test_a_malformed_launch_time_is_refused(tmp_path: Path, bad: object) -> None:
    data = ProfileDB(compute={"k": Measurement(1e-3)}).to_dict()
    data["compute"]["k"]["launch_s"] = bad
    from distsim.core.errors import ProfileError

    with pytest.raises(ProfileError, match="compute 'k'"):
        ProfileDB.from_dict(data)


class LaunchingFallback(AnalyticCosts):
    """An analytic fallback that estimates a launch time (the real one's estimate is another engineer's)."""

    def compute(self, event: ComputeEvent) -> Cost:
        return replace(super().compute(event), launch_s=7e-6)


def test_profile_costs_give_the_measured_launch_time_else_the_fallbacks() -> None:
    other = replace(MLP, phase="B")
    db = ProfileDB(compute={MLP.key: Measurement(1e-3, launch_s=2e-4), other.key: Measurement(3e-3)})
    costs = ProfileCosts(db, LaunchingFallback(get_cluster("dgx-h100")), strict=True)
    assert costs.compute(MLP) == Cost(1e-3, "measured", None, 2e-4)
    assert costs.compute(other) == Cost(3e-3, "measured", None, 7e-6)
    plain = ProfileCosts(db, AnalyticCosts(get_cluster("dgx-h100")))
    assert plain.compute(other).launch_s == AnalyticCosts(get_cluster("dgx-h100")).compute(other).launch_s


def test_the_shipped_profile_predates_launch_times_and_still_loads() -> None:
    db = load_profile(ROOT / "profiles" / "cpu-gloo.json")
    assert db.compute and all(m.launch_s is None and m.insitu_ratio is None for m in db.compute.values())
    cluster = get_cluster("cpu-1x2")
    found = discover(load_model("gpt2-cpu"), cluster, [Strategy.from_str("1M2P1D", num_micro_batches=4)],
                     AnalyticCosts(cluster))  # fmt: skip
    costs, fallback = ProfileCosts(db, AnalyticCosts(cluster), strict=True), AnalyticCosts(cluster)
    for event in found.measurable_compute.values():
        cost = costs.compute(event)
        assert cost.source == "measured" and cost.launch_s == fallback.compute(event).launch_s


def test_the_host_op_costs_measured_on_this_cpu_are_sane() -> None:
    """A sanity bound only (positive, finite, below a second): how fast this machine is, is not tested."""
    before = torch.get_num_threads()
    costs = measure_host_op_costs(repeats=3)
    assert torch.get_num_threads() == before  # the one thread it measured with was given back
    for seconds in (costs.forward_s, costs.backward_s):
        assert math.isfinite(seconds) and 0 < seconds < 1
    assert costs.method.startswith("eager nn.Module chain") and "cpu" in costs.method
    with pytest.raises(ValueError, match="lengths"):
        measure_host_op_costs(lengths=(50, 10))


def test_the_profiler_derives_the_host_time_per_kernel_from_measured_launch_times() -> None:
    """The profiler's per-kernel figure (CUDA only, as launch times are) from launch times given by hand: per phase
    the median over the measured events of launch time / kernels from the op lists."""
    from distsim.profiler.worker import _host_speed, _Rank, _Work
    from distsim.sim.kernels import block_s

    cluster = get_cluster("cpu-1x2")  # the kernel counts of the op lists do not depend on the device
    model = load_model("gpt2-cpu")
    strategy = Strategy.from_str("1M2P1D", num_micro_batches=2)
    found = discover(model, cluster, [strategy], AnalyticCosts(cluster))
    events = found.measurable_compute
    expected: dict[str, list[float]] = {"F": [], "B": []}
    results = {}
    for i, (key, event) in enumerate(sorted(events.items())):
        kernels = block_s(cluster.gpu, event.block.ops, event.phase, event.micro_batch_size, event.effective_tp)[1]
        per_kernel = (50 + i) * 1e-6
        results[key] = Measurement(1e-3, launch_s=per_kernel * kernels)
        expected[event.phase].append(per_kernel)
    me = _Rank(0, 1, 1, torch.device("cpu"), "none", lambda _m: None)
    work = _Work(model, None, [strategy], [], cluster, found)
    host = _host_speed(work, results, None, me)
    assert host.forward_op_s > 0 and host.backward_op_s > 0 and host.backward_call_s is not None
    # a backward launch timed alone carries one backward call's constant, which a loop pays once per micro-batch
    call = host.backward_call_s
    launches = {(event.phase, key): results[key].launch_s for key, event in events.items()}
    kernels_of = {key: block_s(cluster.gpu, e.block.ops, e.phase, e.micro_batch_size, e.effective_tp)[1]
                  for key, e in events.items()}  # fmt: skip
    expected["B"] = [max(0.0, launches[("B", k)] - call) / kernels_of[k] for k, e in sorted(events.items())
                     if e.phase == "B"]  # fmt: skip
    for phase in ("F", "B"):
        assert host.per_kernel_s[phase] == pytest.approx(statistics.median(expected[phase]))
        assert host.per_kernel_events[phase] == len(expected[phase]) > 1
    cpu = _host_speed(work, {k: replace(m, launch_s=None) for k, m in results.items()}, None, me)
    assert cpu.per_kernel_s == {} and cpu.per_kernel_events == {}  # CPU: no launch times, no per-kernel figure
