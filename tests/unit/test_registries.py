"""A name that selects behaviour comes from a registry, and the CLI offers what the registry holds: registering a toy
schedule, sync mode, all-reduce algorithm or GPU type makes it a choice of the command line and runs it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from distsim.core.cluster import GPUS, get_cluster, gpu_type, register_gpu, unregister_gpu
from distsim.core.collectives import (
    COLLECTIVE_ALGORITHMS,
    CollectiveAlgorithm,
    collective_algorithm_names,
    register_collective_algorithm,
)
from distsim.core.errors import ClusterError, UnknownNameError
from distsim.core.mgwfbp import ALLREDUCE_ALGORITHMS, MergeError, allreduce_ab
from distsim.core.models import get_model
from distsim.core.schedules import SCHEDULES, gpipe, register_schedule
from distsim.core.sync import MODES
from distsim.plans import PlanError, plan_from_dict
from distsim.sim.costs import AnalyticCosts, CommEvent
from tests.util import run_cli

SIM = ["simulate", "--model", "gpt2-cpu", "--cluster", "cpu-2x1", "--strategy", "1M2P1D", "--micro-batches", "4"]


@pytest.fixture
def toy_schedule() -> Iterator[str]:
    register_schedule("toy-gpipe", lambda pp, m, policy, max_in_flight, chunks: gpipe(pp, m))
    yield "toy-gpipe"
    del SCHEDULES["toy-gpipe"]


@pytest.fixture
def toy_sync() -> Iterator[str]:
    MODES["toy-bulk"] = MODES["bulk"]
    yield "toy-bulk"
    del MODES["toy-bulk"]


@pytest.fixture
def toy_allreduce() -> Iterator[str]:
    """The ring at twice its cost, in both cost models (the analytic one and MG-WFBP's linear one)."""
    ring = COLLECTIVE_ALGORITHMS["ring"]
    assert ring.all_reduce_s is not None and ring.ab is not None
    seconds, ab = ring.all_reduce_s, ring.ab
    register_collective_algorithm(CollectiveAlgorithm(
        "toy-slow-ring", "the ring at twice its cost",
        all_reduce_s=lambda n, nbytes, latency_s, bandwidth: (2 * seconds(n, nbytes, latency_s, bandwidth)[0], "toy"),
        ab=lambda n, alpha, beta, gamma: (2 * ab(n, alpha, beta, gamma)[0], 2 * ab(n, alpha, beta, gamma)[1]),
    ))  # fmt: skip
    yield "toy-slow-ring"
    del COLLECTIVE_ALGORITHMS["toy-slow-ring"]


@pytest.fixture
def toy_gpu() -> Iterator[str]:
    """A T4 by another name."""
    register_gpu("Toy-T4", replace(GPUS["T4"], name="toy T4"))
    yield "Toy-T4"
    unregister_gpu("Toy-T4")


def _iteration_ms(args: list[str], capsys: pytest.CaptureFixture[str]) -> float:
    code, out, err = run_cli([*args, "--json"], capsys)
    assert code == 0, err
    return float(json.loads(out)["iteration_time_s"])


@pytest.mark.parametrize("command", ["simulate", "execute", "profile", "schedule"])
def test_a_registered_schedule_is_a_choice_of_every_command_that_takes_one(
    command: str, toy_schedule: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli([command, "--help"], capsys)
    assert code == 0 and f"gpipe|1f1b|interleaved|{toy_schedule}" in out.replace("\n", "").replace(" ", "")


def test_a_registered_schedule_runs(toy_schedule: str, capsys: pytest.CaptureFixture[str]) -> None:
    toy = _iteration_ms([*SIM, "--schedule", toy_schedule], capsys)
    assert toy == _iteration_ms([*SIM, "--schedule", "gpipe"], capsys)
    assert toy != _iteration_ms([*SIM, "--schedule", "1f1b"], capsys)  # it is the builder that ran, not a default


def test_an_unregistered_schedule_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli([*SIM, "--schedule", "toy-gpipe"], capsys)
    assert code == 2 and "'toy-gpipe' is not one of 'gpipe', '1f1b', 'interleaved'" in err


def test_a_registered_sync_mode_is_a_choice_and_runs(toy_sync: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["simulate", "--help"], capsys)
    assert code == 0 and toy_sync in out
    args = ["simulate", "--model", "gpt2-cpu", "--cluster", "cpu-1x2", "--strategy", "1M1P2D", "--grad-sync"]
    assert _iteration_ms([*args, toy_sync], capsys) == _iteration_ms([*args, "bulk"], capsys)


# ------------------------------------------------------------------------------------------ all-reduce algorithms
MERGE = ["search", "merge", "--model", "gpt2-cpu", "--cluster", "cpu-2x1", "--json", "--out", ""]
"""Two nodes of one rank each: the data-parallel all-reduce crosses the nodes (where --allreduce applies)."""
DP_ACROSS_NODES = ["simulate", "--model", "gpt2-cpu", "--cluster", "cpu-2x1", "--strategy", "1M1P2D"]


@pytest.mark.parametrize("command", [["simulate"], ["search", "merge"]])
def test_a_registered_allreduce_algorithm_is_a_choice_of_every_command_that_takes_one(
    command: list[str], toy_allreduce: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli([*command, "--help"], capsys)
    flat = out.replace("\n", "").replace(" ", "")
    assert code == 0 and f"[nccl|ring|tree|{toy_allreduce}]" in flat and "theringattwiceitscost" in flat


def test_a_registered_allreduce_algorithm_runs(toy_allreduce: str, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = get_cluster("cpu-2x1")
    event = CommEvent("all_reduce", 10**6, 2, "inter")
    ring = AnalyticCosts(cluster, allreduce="ring").comm(event).seconds
    assert AnalyticCosts(cluster, allreduce=toy_allreduce).comm(event).seconds == 2 * ring
    intra = CommEvent("all_reduce", 10**6, 2, "intra")  # inside a node every all-reduce is the ring
    assert AnalyticCosts(cluster, allreduce=toy_allreduce).comm(intra) == AnalyticCosts(cluster).comm(intra)
    # end to end: simulate, and search merge, which reports and records it
    toy = _iteration_ms([*DP_ACROSS_NODES, "--allreduce", toy_allreduce], capsys)
    assert toy > _iteration_ms([*DP_ACROSS_NODES, "--allreduce", "ring"], capsys)
    code, out, err = run_cli([*MERGE, "--allreduce", toy_allreduce], capsys)
    assert code == 0, err
    data = json.loads(out)
    code, out, err = run_cli([*MERGE, "--allreduce", "ring"], capsys)
    ring_modes = {m["mode"]: m["exposed_comm_s"] for m in json.loads(out)["comparison"]["modes"]}
    assert data["allreduce"] == toy_allreduce
    assert all(m["exposed_comm_s"] > ring_modes[m["mode"]] for m in data["comparison"]["modes"])
    code, out, err = run_cli([*MERGE[:6], "--allreduce", toy_allreduce, "--out", ""], capsys)
    assert code == 0 and "costs: analytic, toy-slow-ring all-reduce" in out


def test_a_registered_allreduce_algorithm_with_a_linear_model_is_mgwfbps_too(toy_allreduce: str) -> None:
    assert toy_allreduce in ALLREDUCE_ALGORITHMS and toy_allreduce in collective_algorithm_names()
    a, b = allreduce_ab("ring", 8, 1, 2, 4)
    assert allreduce_ab(toy_allreduce, 8, 1, 2, 4) == (2 * a, 2 * b)


def test_an_unregistered_allreduce_algorithm_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli([*DP_ACROSS_NODES, "--allreduce", "toy-slow-ring"], capsys)
    assert code == 2 and "'toy-slow-ring' is not one of 'nccl', 'ring', 'tree'" in err
    with pytest.raises(UnknownNameError, match=r"^unknown all-reduce algorithm 'rign' \(did you mean 'ring'\?\)$"):
        AnalyticCosts(get_cluster("cpu-2x1"), allreduce="rign")
    with pytest.raises(UnknownNameError, match=r"^unknown all-reduce algorithm 'binary-tree'; known: nccl, ring, tree"):
        AnalyticCosts(get_cluster("cpu-2x1"), allreduce="binary-tree")  # MG-WFBP's model only: no analytic one
    with pytest.raises(MergeError, match=r"choose from ring, binary-tree, recursive-doubling, rabenseifner$"):
        allreduce_ab("nccl", 8, 1, 1)  # a choice by size, not one linear model


# ------------------------------------------------------------------------------------------------------ GPU types
ELASTIC = ["search", "elastic", "--model", "resnet50", "--max-workers", "4", "--json", "--gpus"]


def test_a_registered_gpu_type_is_a_choice_and_runs(toy_gpu: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["search", "elastic", "--help"], capsys)
    assert code == 0 and f"V100-16GB,{toy_gpu})" in out.replace("\n", "").replace(" ", "")
    assert gpu_type(toy_gpu.lower()) == (toy_gpu, GPUS[toy_gpu])  # case-insensitive, as the built-in types
    code, out, err = run_cli([*ELASTIC, f"{toy_gpu.upper()}:4"], capsys)
    assert code == 0, err
    toy = json.loads(out)["capabilities"][toy_gpu]
    code, out, err = run_cli([*ELASTIC, "T4:4"], capsys)
    t4 = json.loads(out)["capabilities"]["T4"]
    assert toy["per_s"] == t4["per_s"] and toy["gpu_type"] == toy_gpu and "on toy T4" in toy["source"]


def test_an_unregistered_gpu_type_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli([*ELASTIC, "Toy-T4:4"], capsys)
    assert code == 2 and err.strip().splitlines() == [
        "distsim: error: unknown GPU type 'Toy-T4'; known: A10, A40, A100, H100, H200, P100, T4, V100, V100-16GB"
    ]
    with pytest.raises(ClusterError, match="without ':' or ','"):
        register_gpu("T4:8", GPUS["T4"])
    assert "T4:8" not in GPUS


# ---------------------------------------------------------------------------------------------------- plan kinds
class _Replicated:
    """A toy plan kind: the whole model data-parallel on the GPUs a plan file lists (``replicated: 0-3``), built as
    the one-stage stages plan it is; what a new kind needs is this class and its registration."""

    name = "replicated"
    marker_keys = frozenset({"replicated"})
    file_keys = marker_keys | {"micro_batch_size"}
    memory_per_gpu = False

    def _as_stages(self, plan: object) -> object:
        from distsim.plans import Plan, StagePlan

        layers = plan.note.get("layers", 0)  # type: ignore[attr-defined]
        return Plan.of_stages(plan.model, plan.cluster, [StagePlan((0, layers), plan.layout)],  # type: ignore[attr-defined]
                              micro_batch_size=plan.strategy.micro_batch_size)  # type: ignore[attr-defined]  # fmt: skip

    def check_fields(self, plan: object) -> None:
        return None

    def check(self, plan: object, num_layers: int, num_gpus: int) -> None:
        return None

    def gpus(self, plan: object) -> tuple[int, ...]:
        return tuple(sorted(plan.layout))  # type: ignore[attr-defined]

    def notation(self, plan: object) -> str:
        return f"replicated x{len(plan.layout)}"  # type: ignore[attr-defined]

    def detail(self, plan: object) -> str:
        return self.notation(plan)

    def summary(self, plan: object) -> str:
        return f"the whole model on each of {len(plan.layout)} GPUs"  # type: ignore[attr-defined]

    def layout_line(self, plan: object) -> tuple[str, str] | None:
        return None

    def to_dict(self, plan: object) -> dict[str, object]:
        from distsim.plans.plan import format_devices

        return {"replicated": format_devices(plan.layout), "micro_batch_size": plan.strategy.micro_batch_size}  # type: ignore[attr-defined]

    def from_dict(self, data: dict, where: str, common: dict) -> object:
        from distsim import Strategy
        from distsim.plans import Plan
        from distsim.plans.plan import parse_devices

        strategy = Strategy(micro_batch_size=data.get("micro_batch_size", 1))
        return Plan(strategy=strategy, kind="replicated", layout=parse_devices(data["replicated"], where), **common)

    def build_flow(self, model, cluster, plan, costs, options):  # type: ignore[no-untyped-def]
        from distsim.plans import PLAN_KINDS

        stages = self._as_stages(replace(plan, note={"layers": model.num_layers}))
        return PLAN_KINDS["stages"].build_flow(model, cluster, stages, costs, options)

    def estimate_tasks(self, model, cluster, plan, costs, options):  # type: ignore[no-untyped-def]
        from distsim.plans import PLAN_KINDS

        stages = self._as_stages(replace(plan, note={"layers": model.num_layers}))
        return PLAN_KINDS["stages"].estimate_tasks(model, cluster, stages, costs, options)

    def memory(self, model, cluster, plan, flow):  # type: ignore[no-untyped-def]
        from distsim.plans import PLAN_KINDS

        stages = self._as_stages(replace(plan, note={"layers": model.num_layers}))
        return PLAN_KINDS["stages"].memory(model, cluster, stages, flow)


@pytest.fixture
def toy_plan_kind() -> Iterator[str]:
    from distsim.plans import PLAN_KINDS, register_plan_kind

    register_plan_kind(_Replicated())
    yield "replicated"
    del PLAN_KINDS["replicated"]


def test_a_registered_plan_kind_is_read_from_a_plan_file_and_simulated(
    toy_plan_kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new kind is its registry entry: plan files name it, simulate runs it, and it predicts what the equivalent
    stages plan does."""
    toy = tmp_path / "toy.yaml"
    toy.write_text("kind: replicated\nmodel: gpt2-cpu\ncluster: cpu-2x1\nreplicated: 0-1\nmicro_batch_size: 2\n")
    layers = get_model("gpt2-cpu").num_layers
    same = tmp_path / "stages.yaml"
    same.write_text(
        f"model: gpt2-cpu\ncluster: cpu-2x1\nmicro_batch_size: 2\nstages: [{{layers: [0, {layers}], devices: 0-1}}]\n"
    )
    got = {}
    for path in (toy, same):
        code, out, err = run_cli(["simulate", "--plan", str(path), "--json"], capsys)
        assert code == 0, err
        got[path.name] = json.loads(out)
    assert got["toy.yaml"]["strategy"] == "replicated x2"
    code, out, err = run_cli(["simulate", "--plan", str(toy)], capsys)  # the report asks the kind what to say
    assert code == 0 and "plan replicated x2 (the whole model on each of 2 GPUs)" in out, err
    assert got["toy.yaml"]["iteration_time_s"] == got["stages.yaml"]["iteration_time_s"]
    with pytest.raises(PlanError, match="kind must be one of uniform, stages, burst, replicated"):
        plan_from_dict({"kind": "nope", "model": "m", "cluster": "c"}, "p.yaml")
