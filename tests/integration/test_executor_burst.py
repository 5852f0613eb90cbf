"""The executor runs burst plans (DeepPool): two gloo ranks train as the single-process reference does, with the
simulator's events (its re-distributions, per-layer all-reduces and tied copies' all-reduce) on the same ranks."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from distsim.core.models import get_model
from distsim.plans.redistribution import pieces, redistribution, shards
from tests.util import run_cli

TINY = "gpt2-345m:seq=16,layers=2,hidden=32,heads=4,vocab=64,precision=fp32"
"""Four layers: embedding, layer0, layer1, lm_head (tied to the embedding)."""


def test_pieces_cut_the_batch_into_what_each_gpu_sends_each_other_gpu() -> None:
    """Against the layouts' own slices and :func:`redistribution`'s counts, on random layouts."""
    rng = random.Random(0)
    for _ in range(300):
        batch = rng.randint(1, 40)
        src = tuple(rng.sample(range(12), rng.randint(1, min(batch, 6))))
        dst = tuple(rng.sample(range(12), rng.randint(1, min(batch, 6))))
        cut = pieces(batch, src, dst)
        assert [lo for lo, *_ in cut] == [0, *[hi for _, hi, *_ in cut[:-1]]] and cut[-1][1] == batch
        have, need = shards(batch, src), shards(batch, dst)
        for lo, hi, a, b in cut:
            assert have[a][0] <= lo < hi <= have[a][1] and need[b][0] <= lo < hi <= need[b][1]
        moved = redistribution(batch, src, dst)
        for g in set(src) | set(dst):
            assert sum(hi - lo for lo, hi, a, b in cut if a == g != b) == moved.sent.get(g, 0)
            assert sum(hi - lo for lo, hi, a, b in cut if b == g != a) == moved.received.get(g, 0)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (f"model: '{TINY}'\ncluster: cpu-1x2\nbatch: 2\nlayers: [{{gpus: 1}}, {{gpus: 1}}, {{gpus: 1}}, {{gpus: 1}}]\n",
         "runs a burst plan on ranks 0..N-1 as its GPUs; this one uses GPUs 1 (renumber them from 0)"),
        (f"model: '{TINY}'\ncluster: cpu-1x2\nbatch: 1\ncounts: 1x1,2x3\n", "batch has only 1 samples"),
        ("model: vgg16\ncluster: cpu-1x2\nbatch: 2\ncounts: 1x{vgg}\n",
         "whose last layer computes the loss (an LM head); vgg16 ends in fc8 (linear)"),
    ],
)  # fmt: skip
def test_execute_refuses_a_burst_plan_it_cannot_run_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, message: str
) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text("kind: burst\n" + body.replace("{vgg}", str(get_model("vgg16").num_layers)))
    code, _, err = run_cli(["execute", "--plan", str(plan), "--out", str(tmp_path / "t.json")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err


def test_profile_discovers_a_burst_plans_events(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`distsim profile --plan` discovers what the simulator's flow for the plan costs: compute at each shard size
    (4 on one GPU, 2 on two), the re-distributions' point-to-point sizes and the layers' all-reduces."""
    plan = tmp_path / "p.yaml"
    plan.write_text(f"kind: burst\nmodel: '{TINY}'\ncluster: cpu-1x2\nbatch: 4\ncounts: 1x1,2x2,1x1\n")
    code, _, err = run_cli(["profile", "--plan", str(plan), "--dry-run"], capsys)
    assert code == 0, err
    # embedding and lm_head at 4 samples, two transformer layers' 2 blocks at 2 (F and B each): 2 x (2 + 2) = 8
    assert err.startswith("1 plan of ") and "compute        8 distinct" in err
    assert "all_reduce intra x2, p2p intra x2" in err


def test_validating_a_burst_trace_against_another_devices_profile_names_the_plan_to_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped burst trace with a profile of another device: the one-line refusal's profile command takes the
    trace's plan as a file (`--plan PLAN.yaml`), and distsim accepts it once PLAN.yaml holds the trace's plan.burst."""
    import shlex

    trace_data = json.loads(Path("traces/gpt2-cpu-1x2-burst-emb1-wfbp-B8.json").read_text())
    profile_data = json.loads(Path("profiles/validation/gpt2-cpu-1x2-burst.json").read_text())
    profile_data["provenance"]["device"] = "Another CPU"
    (tmp_path / "other.json").write_text(json.dumps(profile_data))
    (tmp_path / "mine.json").write_text(json.dumps(trace_data))
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["validate", "--trace", "mine.json", "--profile", "other.json"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "with PLAN.yaml holding the trace's plan.burst" in err
    command = shlex.split(err.split("`")[1])
    assert command[command.index("--plan") + 1] == "PLAN.yaml" and "--strategy" not in command
    Path("PLAN.yaml").write_text(json.dumps(trace_data["plan"]["burst"]))
    code, _, err = run_cli([*command[1:], "--dry-run"], capsys)
    assert code == 0 and err.startswith("1 plan of gpt2-cpu on cpu-1x2"), err


# -------------------------------------------------------------------------------------------------- real runs
def execute(plan: Path, out: Path, check: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "distsim", "execute", "--plan", str(plan), "--emulate-nodes", "1",
                          "--procs-per-node", "2", "--iterations", "1", "--warmup", "0", "--check", str(check),
                          "--out", str(out)], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr


def rows_of(df: Any, gpu: int) -> list[tuple[float, str, str, str, int]]:
    mine = df[df["gpu"] == gpu]
    return sorted(zip(mine["start_s"], mine["stream"].astype(str), mine["kind"].astype(str), mine["name"].astype(str),
                      mine["layer"], strict=True))  # fmt: skip


@pytest.mark.slow  # real multi-process runs
@pytest.mark.parametrize(
    ("layouts", "batch", "sync"),
    [
        ("counts: 1x1,2x2,1x1", 4, "bulk"),  # a layer on one rank, the next on two, and back
        # uneven shards (2 + 1), layer1's ranks swapped (its samples change rank both ways), and the LM head on both
        # ranks while the embedding it is tied to is on one: copies all-reduced over both
        ("layers: [1, 2, {gpus: [1, 0]}, 2]", 3, "wfbp"),
    ],
)
def test_two_ranks_run_a_burst_plan_as_one_process_with_the_simulators_events(
    tmp_path: Path, layouts: str, batch: int, sync: str
) -> None:
    torch = pytest.importorskip("torch")
    from distsim import get_cluster, simulate
    from distsim.executor.reference import reference_step
    from distsim.io.files import load_plan
    from tests.integration.test_executor_scale import assert_same_step

    plan_file, out, check = tmp_path / "p.yaml", tmp_path / "t.json", tmp_path / "c.pt"
    plan_file.write_text(f"kind: burst\nmodel: '{TINY}'\ncluster: cpu-1x2\nbatch: {batch}\ngrad_sync: {sync}\n"
                         f"{layouts}\n")  # fmt: skip
    execute(plan_file, out, check)
    model, cluster, plan = get_model(TINY), get_cluster("cpu-1x2"), load_plan(str(plan_file))
    got, want = torch.load(check), reference_step(model, cluster, plan.strategy)
    assert_same_step(got, want)  # loss, every gradient, the parameters after Adam's step
    assert got["expected_losses"] == len(got["losses"]) == len(plan.burst[-1])  # the LM head's ranks' shares
    trace = json.loads(out.read_text())
    assert trace["losses"][0] == [pytest.approx(want["loss"], rel=1e-5)]

    import pandas as pd

    measured = pd.DataFrame(trace["iterations"][0]["columns"])
    simulated = simulate(model, cluster, plan).timeline.expand().df
    for gpu in (0, 1):
        sim, ran = rows_of(simulated, gpu), rows_of(measured, gpu)
        assert {r[1:4] for r in ran} == {r[1:4] for r in sim}  # (stream, kind, name): the same events on each rank
        assert [r[2:] for r in ran if r[1] == "compute"] == [r[2:] for r in sim if r[1] == "compute"]  # in order
    kinds = set(measured["kind"])
    assert {"p2p", "dp_allreduce"} <= kinds
    transfers = measured[measured["kind"] == "p2p"].groupby("name")["start_s"].nunique()
    assert len(transfers) >= 2 and (transfers == 1).all()  # each spans its movers from its first send, as simulated

    import distsim.cli.validate as validate

    _trace, _result, val, _warnings = validate._validate_one(str(out), None, samples=0)
    compute = measured[measured["kind"].isin(["forward", "backward"])]
    assert val.comparisons[0].matched == len(compute) and val.comparisons[0].unmatched == 0
