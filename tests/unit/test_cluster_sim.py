"""The inter-job schedulers (EasyScale's proposal/grant loop, YARN-CS) and the cluster-trace simulation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distsim.cli.cluster_sim import DEFAULT_TRACE
from distsim.elastic.cluster_sim import simulate_cluster
from distsim.elastic.jobs import Job, TraceError, read_csv, read_philly, write_csv
from distsim.elastic.scheduler import ESTIMATES, SCHEDULERS, Grant
from distsim.elastic.synth import generate
from distsim.elastic.workloads import MODELS
from tests.util import run_cli as run

DATA = Path(__file__).parents[1] / "data"
CAPS = {"V100": 10.0, "T4": 5.0}


def job(name: str, arrival_s: float, gpus: int, duration_s: float, gpu_type: str | None = None) -> Job:
    return Job(name, arrival_s, gpus, gpus, duration_s, "hand", CAPS, gpu_type)


@pytest.mark.parametrize("estimate", ["linear", "planner"])
def test_easyscale_grant_order_on_three_jobs(estimate: str) -> None:
    # Cluster V100:7, T4:2; C = 10 (V100) and 5 (T4) mini-batches/s for every job.
    # A (P=4) runs on V100:2, B (P=2) on V100:1, C (P=4) waits: free V100:4, T4:2.
    a, b, c = job("A", 0, 4, 100), job("B", 1, 2, 100), job("C", 2, 4, 100)
    alloc = {"A": {"V100": 2}, "B": {"V100": 1}}
    new, grants = SCHEDULERS["easyscale"].schedule([a, b, c], alloc, {"V100": 4, "T4": 2}, ESTIMATES[estimate]())
    # 1. initial proposals, FIFO: C gets one V100 (the fastest type with a free GPU); free V100:3, T4:2.
    # 2. increments (thr = sum N_i C_i here; the planner agrees where the ESTs divide evenly, and it leaves a third
    #    V100 of A idle, so A's +1 V100 is not proposed under it):
    #    B: 1 -> 2 V100: 10 -> 20, score (20/10 - 1)/1 = 1.0;   1 V100 + 1 T4: 10 -> 15, score 0.5
    #    A: +1 V100: 20 -> 30, score 0.5;  +2 V100: 20 -> 40, score (2 - 1)/2 = 0.5, a tie: more GPUs first
    #       +1 T4: 20 -> 25, score 0.25;   +2 T4: 20 -> 30, score 0.25
    # 3. grants, best first, one per job: B +1 V100 (1.0; free V100:2), A +2 V100 (0.5; free V100:0); B's T4 and
    #    A's other proposals: those jobs were granted this round.
    assert grants == [Grant("C", "V100", 1), Grant("B", "V100", 1, 1.0), Grant("A", "V100", 2, 0.5)]
    assert new == {"A": {"V100": 4}, "B": {"V100": 2}, "C": {"V100": 1}}


def test_easyscale_homo_keeps_a_job_on_its_type() -> None:
    # A on V100:1 (P=2) with no free V100: the heterogeneous scheduler adds a T4 (10 -> 15, score 0.5), homo cannot.
    a, linear = job("A", 0, 2, 100), ESTIMATES["linear"]()
    _, hetero = SCHEDULERS["easyscale"].schedule([a], {"A": {"V100": 1}}, {"V100": 0, "T4": 2}, linear)
    _, homo = SCHEDULERS["easyscale-homo"].schedule([a], {"A": {"V100": 1}}, {"V100": 0, "T4": 2}, linear)
    assert hetero == [Grant("A", "T4", 1, 0.5)]
    assert homo == []


def test_yarn_cs_two_jobs_by_hand() -> None:
    # V100:4, T4:2. J1 asks for 2 GPUs for 100 s: V100:2 at t=0, done at 100 (work 100 s x 2 x 10 = 2000 at 20/s).
    # J2 (t=10) asks for 4: V100 has 2 free and T4 2, so it waits for J1: V100:4 from 100 to 150.
    # JCTs 100 and 140 s (mean 120), makespan 150 s.
    res = simulate_cluster([job("J1", 0, 2, 100), job("J2", 10, 4, 50)], {"V100": 4, "T4": 2}, "yarn-cs")
    assert res.finish_s == pytest.approx({"J1": 100.0, "J2": 150.0})
    assert res.jct_mean_s == pytest.approx(120.0)
    assert res.makespan_s == pytest.approx(150.0)
    assert [(t, g) for t, g in res.grants] == [(0, Grant("J1", "V100", 2)), (100, Grant("J2", "V100", 4))]


def test_yarn_cs_blocks_behind_the_head_of_the_queue() -> None:
    # As above plus J3 (t=20, 1 GPU, 10 s): two V100s are free but J2 heads the queue, so J3 waits until J2 starts
    # at 100, then takes a T4 (no V100 left): work 10 x 1 x 10 = 100 at 5/s, done at 120.
    jobs = [job("J1", 0, 2, 100), job("J2", 10, 4, 50), job("J3", 20, 1, 10)]
    res = simulate_cluster(jobs, {"V100": 4, "T4": 2}, "yarn-cs")
    assert res.finish_s["J3"] == pytest.approx(120.0)


def test_yarn_cs_waits_for_the_pinned_type() -> None:
    # V100:2, T4:2. J1 takes V100:2 for 100 s. J2 (t=10, 2 GPUs, 50 s at 2 x 10/s = work 1000):
    # any type: T4:2 at once, 1000 / (2 x 5) = 100 s, done at 110; pinned to V100: waits for J1, done at 150.
    free_type = simulate_cluster([job("J1", 0, 2, 100), job("J2", 10, 2, 50)], {"V100": 2, "T4": 2}, "yarn-cs")
    pinned = simulate_cluster([job("J1", 0, 2, 100), job("J2", 10, 2, 50, "V100")], {"V100": 2, "T4": 2}, "yarn-cs")
    assert free_type.finish_s["J2"] == pytest.approx(110.0)
    assert pinned.finish_s["J2"] == pytest.approx(150.0)


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_invariants(scheduler: str, seed: int) -> None:
    gpus = {"V100": 8, "P100": 4, "T4": 4}
    jobs = [j for j in generate(40, seed, mean_gap_s=10) if j.gpus <= 4]  # a gang fits its pinned type
    res = simulate_cluster(jobs, gpus, scheduler)
    assert set(res.finish_s) == {j.job_id for j in jobs}  # every job finishes
    assert all(res.peak[t] <= gpus[t] for t in gpus)  # never more GPUs of a type than the cluster has
    for j in jobs:  # work conservation
        assert res.processed[j.job_id] == pytest.approx(j.work, rel=1e-9)
        assert res.finish_s[j.job_id] - j.arrival_s >= j.duration_s * (1 - 1e-9)  # no faster than its gang on V100
    assert 0 < res.mean_allocation_ratio <= 1


def test_elastic_beats_gang_on_the_shipped_trace() -> None:
    jobs = read_csv(DEFAULT_TRACE)
    gpus = {"V100": 32, "P100": 16, "T4": 16}
    yarn, homo, hetero = (simulate_cluster(jobs, gpus, s) for s in ("yarn-cs", "easyscale-homo", "easyscale"))
    assert yarn.jct_mean_s > homo.jct_mean_s > hetero.jct_mean_s
    assert yarn.makespan_s > homo.makespan_s > hetero.makespan_s


def test_gang_larger_than_any_type_is_one_line() -> None:
    with pytest.raises(TraceError, match="gang of 8 GPUs"):
        simulate_cluster([job("J", 0, 8, 10)], {"V100": 4, "T4": 4}, "yarn-cs")


def test_csv_round_trip(tmp_path: Path) -> None:
    jobs = generate(5, seed=3)
    with open(tmp_path / "t.csv", "w", encoding="utf-8") as fh:
        write_csv(jobs, fh)
    back = read_csv(str(tmp_path / "t.csv"))
    assert [(j.job_id, j.gpus, j.model, dict(j.capabilities), j.gpu_type) for j in back] == [
        (j.job_id, j.gpus, j.model, MODELS[j.model], j.gpu_type) for j in jobs
    ]


def test_philly_reader_maps_the_schema() -> None:
    jobs = read_philly(str(DATA / "philly_sample.json"))
    # 0003 never ran (no attempt) and 0004 has no end_time: skipped. Arrivals from the first submission (02:00:00).
    # 0002: its last attempt counts, 4 + 4 GPUs on two machines, 02:20 -> 02:50.
    assert [(j.job_id, j.arrival_s, j.gpus, j.max_workers, j.duration_s) for j in jobs] == [
        ("application_1_0001", 0.0, 2, 2, 3600.0),
        ("application_1_0002", 600.0, 8, 8, 1800.0),
    ]
    names = sorted(MODELS)
    assert [j.model for j in jobs] == [names[0], names[1]]
    assert dict(jobs[1].capabilities) == MODELS[names[1]]


def test_philly_reader_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"jobid": 1}))
    with pytest.raises(TraceError, match="JSON list"):
        read_philly(str(bad))
    bad.write_text("[{]")
    with pytest.raises(TraceError, match="not JSON"):
        read_philly(str(bad))


def test_cli_both_side_by_side(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(["cluster-sim", "--plot", str(tmp_path / "c.png")], capsys)
    assert code == 0, err
    for needle in ("yarn-cs", "easyscale-homo", "8.3x", "13.2x", "2.5x", "2.8x", "makespan"):
        assert needle in out
    assert (tmp_path / "c.png").stat().st_size > 0


def test_cli_json_on_a_philly_trace(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["cluster-sim", "--trace", str(DATA / "philly_sample.json"), "--scheduler", "easyscale",
                          "--gpus", "V100:8", "--json"], capsys)  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert [r["jobs"] for r in data["results"]] == [2]
    assert data["vs_yarn_cs"] == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--gpus", "V100"], "--gpus takes TYPE:COUNT"),
        (["--trace", "nope.csv"], "cannot read trace nope.csv"),
        (["--trace", "x.txt"], ".csv (synthetic format) or .json"),
        (["--gpus", "A100:4"], "none of the cluster's GPU types"),
    ],
)
def test_cli_errors_are_one_line(capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    code, _, err = run(["cluster-sim", *args], capsys)
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1


def test_capability_hook_replaces_the_trace_figures() -> None:
    # A runtime is at the gang on the fastest type, so capabilities set the types' relative speeds. On T4s only:
    # trace figures (V100 10, T4 5): 100 s x 2 x 10 = 2000 mini-batches at 2 x 5/s = 200 s; a hook that makes a T4 as
    # fast as a V100: 100 s.
    jobs = [job("J1", 0, 2, 100)]
    assert simulate_cluster(jobs, {"T4": 2}, "yarn-cs").finish_s["J1"] == pytest.approx(200.0)
    same = simulate_cluster(jobs, {"T4": 2}, "yarn-cs", capability=lambda j: {"V100": 10.0, "T4": 10.0})
    assert same.finish_s["J1"] == pytest.approx(100.0)


def test_cli_simulated_capabilities_replace_the_trace_figures_of_zoo_models(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--simulate-capabilities: a zoo model's C_i comes from the simulator (1 / its one-GPU iteration), so the
    result differs from the trace's assumed figures; a model outside the zoo keeps them."""
    from distsim import get_model
    from distsim.cli.cluster_sim import simulated_capabilities
    from distsim.elastic.capability import capability
    from distsim.elastic.jobs import Job

    hook, simulated = simulated_capabilities({"V100": 2, "T4": 2}, 32)
    resnet = Job("a", 0.0, 1, 2, 100.0, "resnet50", {"V100": 10.0, "T4": 5.0})
    other = Job("b", 0.0, 1, 2, 100.0, "neumf", {"V100": 40.0, "T4": 20.0})
    assert hook(resnet)["V100"] == pytest.approx(capability(get_model("resnet50"), "V100", 32))
    assert hook(resnet)["T4"] == pytest.approx(capability(get_model("resnet50"), "T4", 32))
    assert hook(other) == {"V100": 40.0, "T4": 20.0} and simulated == ["resnet50"]
    base = ["cluster-sim", "--scheduler", "easyscale", "--json"]
    code, out, err = run(base, capsys)
    code2, out2, err2 = run([*base, "--simulate-capabilities", "32"], capsys)
    assert code == 0 and code2 == 0, err + err2
    assert json.loads(out)["results"] != json.loads(out2)["results"]
