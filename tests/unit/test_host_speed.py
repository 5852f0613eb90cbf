"""The profiling host's speed in a profile: its storage (round trip, older profiles, merging, malformed entries),
the host time per kernel that paces the events a profile did not measure (ProfileCosts), and `profile show`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from distsim.core.cluster import Cluster
from distsim.core.errors import ProfileError
from distsim.core.framework import DEFAULT_FRAMEWORK, get_framework
from distsim.core.models.graph import FP32
from distsim.core.models.transformer import mlp_block
from distsim.io.files import load_profile, write_json
from distsim.sim.costs import AnalyticCosts, ComputeEvent, ProfileCosts
from distsim.sim.kernels import block_s
from distsim.sim.profile_db import HostSpeed, Measurement, ProfileDB
from tests.util import hand_cluster, run_cli

LAUNCH = 7e-6
PER_KERNEL = {"F": 63e-6, "B": 84e-6}
HOST = HostSpeed(11.0e-6, 14.8e-6, "eager nn.Module chain, cpu, 1 thread", dict(PER_KERNEL), {"F": 24, "B": 22})
MLP_F = ComputeEvent(mlp_block(32, 64, 8, FP32), "F", 1, 1, "fp32")
MLP_B = replace(MLP_F, phase="B")
OTHER_F = ComputeEvent(mlp_block(32, 64, 8, FP32), "F", 2, 1, "fp32")  # micro-batch 2: not in the profile
OTHER_B = replace(OTHER_F, phase="B")


def _cluster(launch: float = LAUNCH) -> Cluster:
    """The hand cluster whose GPU launches each kernel in `launch` seconds."""
    c = hand_cluster(1, 2)
    return replace(c, gpu=replace(c.gpu, kernel_launch_s=launch))


def _kernels(cluster: Cluster, event: ComputeEvent) -> int:
    b = event.block
    return block_s(cluster.gpu, b.ops, event.phase, event.micro_batch_size, event.effective_tp)[1]


def _db(host: HostSpeed | None = HOST) -> ProfileDB:
    return ProfileDB(provenance={"device": "dev"},
                     compute={MLP_F.key: Measurement(1e-3, launch_s=2e-4), MLP_B.key: Measurement(2e-3)},
                     host=host)  # fmt: skip


# ------------------------------------------------------------------------------------------------------ storage
def test_the_host_speed_round_trips_through_the_profile_database(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    write_json(path, _db().to_dict())
    raw = json.loads(path.read_text())
    assert raw["version"] == 1  # added to version 1: readers that do not know it ignore it
    assert raw["host"] == {"forward_op_s": 11.0e-6, "backward_op_s": 14.8e-6,
                           "method": "eager nn.Module chain, cpu, 1 thread", "per_kernel_s": {"B": 84e-6, "F": 63e-6},
                           "per_kernel_events": {"B": 22, "F": 24}}  # fmt: skip
    assert load_profile(path).host == HOST
    cpu_only = HostSpeed(1e-5, 1.2e-5, "eager nn.Module chain, cpu, 1 thread")  # no per-kernel figure on CPU
    write_json(path, _db(cpu_only).to_dict())
    assert "per_kernel_s" not in json.loads(path.read_text())["host"] and load_profile(path).host == cpu_only


def test_an_older_profile_without_the_host_speed_still_loads(tmp_path: Path) -> None:
    data = _db(None).to_dict()
    assert "host" not in data
    assert ProfileDB.from_dict(data).host is None
    shipped = load_profile(Path(__file__).resolve().parents[2] / "profiles" / "cpu-gloo.json")
    assert shipped.host is None and shipped.compute


def test_extending_a_profile_keeps_the_per_kernel_figure_its_new_run_lacks() -> None:
    newer = ProfileDB(provenance={"device": "dev"}, host=HostSpeed(9e-6, 12e-6, "newer"))
    merged = _db().merge(newer)
    assert merged.host == HostSpeed(9e-6, 12e-6, "newer", PER_KERNEL, {"F": 24, "B": 22})
    again = merged.merge(ProfileDB(host=HostSpeed(8e-6, 1e-5, "m", {"B": 90e-6}, {"B": 3})))
    assert again.host is not None and again.host.per_kernel_s == {"F": 63e-6, "B": 90e-6}
    assert again.host.per_kernel_events == {"F": 24, "B": 3}
    assert _db(None).merge(newer).host == newer.host and _db().merge(_db(None)).host == HOST


@pytest.mark.parametrize(
    ("entry", "problem"),
    [({"forward_op_s": -1e-6}, "forward_op_s must be >= 0"), ({"backward_op_s": 2.0}, "below 1"),
     ({"per_kernel_s": {"X": 1e-5}}, "phases are F and B"), ({"per_kernel_s": {"F": float("nan")}}, "finite"),
     ({"per_kernel_s": [1e-5]}, "must be objects"), ("fast", "expected an object")],
)  # fmt: skip
def test_a_malformed_host_speed_is_refused_in_one_line(entry: object, problem: str) -> None:
    data = _db(None).to_dict()
    data["host"] = entry
    with pytest.raises(ProfileError, match=f"profile: host: .*{problem}"):
        ProfileDB.from_dict(data)


# --------------------------------------------------------------------------------------------------- the costs
def test_the_fallback_charges_the_profiles_host_time_per_kernel() -> None:
    """An event the profile did not measure (micro-batch 2) is estimated analytically; its launch is its kernel count
    times the host time per kernel the profile recorded (the GPU's 7 us launch included), not the preset's."""
    cluster = _cluster()
    costs = ProfileCosts(_db(), AnalyticCosts(cluster))
    for event in (OTHER_F, OTHER_B):
        cost = costs.compute(event)
        assert cost.source == "analytic"
        assert cost.launch_s == pytest.approx(_kernels(cluster, event) * PER_KERNEL[event.phase], rel=1e-12)
    preset = get_framework(DEFAULT_FRAMEWORK)
    plain = ProfileCosts(_db(None), AnalyticCosts(cluster)).compute(OTHER_F)  # no figure: the preset's
    assert plain.launch_s == pytest.approx(_kernels(cluster, OTHER_F) * (LAUNCH + preset.host_op_s), rel=1e-12)
    assert costs.fallback.framework == replace(preset, host_op_s=63e-6 - LAUNCH, host_backward_op_s=84e-6 - LAUNCH)


def test_measured_events_keep_their_own_launch_and_others_take_the_recorded_pace() -> None:
    cluster = _cluster()
    costs = ProfileCosts(_db(), AnalyticCosts(cluster), strict=True)
    assert costs.compute(MLP_F).launch_s == 2e-4  # measured with its launch time
    measured_b = costs.compute(MLP_B)  # measured without one (an older profile's event): the recorded pace
    assert measured_b.source == "measured"
    assert measured_b.launch_s == pytest.approx(_kernels(cluster, MLP_B) * 84e-6, rel=1e-12)


def test_the_recorded_pace_changes_nothing_where_no_host_paces_the_device() -> None:
    """A CPU device (launch 0) and CUDA graphs have no per-kernel host time, whatever the profile's host."""
    cpu = hand_cluster(1, 2)
    assert ProfileCosts(_db(), AnalyticCosts(cpu)).compute(OTHER_F).launch_s == 0.0
    graphs = AnalyticCosts(_cluster(), framework=get_framework("torch-compile"))
    assert ProfileCosts(_db(), graphs).compute(OTHER_B).launch_s == 0.0
    fast_gpu = _cluster(launch=1e-4)  # a launch above the recorded figure: no negative framework time
    fallback = ProfileCosts(_db(), AnalyticCosts(fast_gpu)).fallback
    assert fallback.framework.host_op_s == 0.0 and fallback.framework.host_backward_op_s == 0.0


def test_only_the_recorded_phase_replaces_the_presets() -> None:
    cluster = _cluster()
    host = HostSpeed(per_kernel_s={"B": 50e-6}, per_kernel_events={"B": 4})
    framework = ProfileCosts(_db(host), AnalyticCosts(cluster)).fallback.framework
    preset = get_framework(DEFAULT_FRAMEWORK)
    assert framework.host_op_s == preset.host_op_s and framework.host_backward_op_s == pytest.approx(43e-6)


# --------------------------------------------------------------------------------------------------------- show
def test_profile_show_prints_the_hosts_speed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.json"
    write_json(path, _db().to_dict())
    code, out, _ = run_cli(["profile", "show", str(path)], capsys)
    assert code == 0
    assert "host: 11.0 us per forward op, 14.8 us per backward op (eager nn.Module chain, cpu, 1 thread)" in out
    assert ("host per kernel (from the measured blocks): 63 us forward, 84 us backward (median of 24 forward and 22 "
            "backward events)") in out  # fmt: skip
    write_json(path, _db(HostSpeed(1e-5, 1.2e-5, "eager nn.Module chain, cpu, 1 thread")).to_dict())
    code, out, _ = run_cli(["profile", "show", str(path)], capsys)
    assert code == 0 and "host: 10.0 us per forward op, 12.0 us per backward op" in out
    assert "host per kernel" not in out
    write_json(path, _db(None).to_dict())
    code, out, _ = run_cli(["profile", "show", str(path)], capsys)
    assert code == 0 and "host:" not in out and "host per kernel" not in out


def test_a_measured_backward_launch_loses_one_backward_calls_constant() -> None:
    """A block's backward launch was timed as a backward call of its own; a training loop makes one call per
    micro-batch, so the call's constant (recorded with the host's speed) is not charged per block."""
    host = replace(HOST, backward_call_s=1.5e-4)
    db = ProfileDB(
        provenance={"device": "dev"},
        host=host,
        compute={MLP_F.key: Measurement(1e-3, launch_s=2e-4), MLP_B.key: Measurement(2e-3, launch_s=4e-4)},
    )
    costs = ProfileCosts(db, AnalyticCosts(_cluster()))
    assert costs.compute(MLP_B).launch_s == pytest.approx(4e-4 - 1.5e-4)
    assert costs.compute(MLP_F).launch_s == 2e-4  # a forward has no engine call of its own
    small = replace(db, host=replace(host, backward_call_s=1e-3))  # never below nothing
    assert ProfileCosts(small, AnalyticCosts(_cluster())).compute(MLP_B).launch_s == 0.0
    older = replace(db, host=HOST)  # a profile without the figure: launches as measured
    assert ProfileCosts(older, AnalyticCosts(_cluster())).compute(MLP_B).launch_s == 4e-4


def test_the_backward_calls_constant_round_trips_and_is_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.json"
    write_json(path, _db(replace(HOST, backward_call_s=1.5e-4)).to_dict())
    assert json.loads(path.read_text())["host"]["backward_call_s"] == 1.5e-4
    assert load_profile(path).host == replace(HOST, backward_call_s=1.5e-4)
    code, out, err = run_cli(["profile", "show", str(path)], capsys)
    assert code == 0 and "150.0 us per backward call" in out + err
