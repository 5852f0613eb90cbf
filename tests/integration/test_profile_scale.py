"""Profiling what activation recomputation, sequence parallelism and a sharded optimizer run (issue 12).

Recomputation adds no event to measure (a recomputed forward is its forward's event; selective recomputation's
attention core is derived from the measured attention block, as a sequence-parallel block is from its block). The
reduce-scatters and all-gathers of sequence parallelism and ZeRO are measured and fitted by real gloo ranks, and
``distsim simulate --profile`` costs them from the profile. What gloo runs for them is checked on this torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from distsim.core.strategy import Strategy
from distsim.io.files import load_cluster, load_model, load_profile
from distsim.search.discovery import Discovery, discover
from distsim.sim.costs import AnalyticCosts, ProfileCosts
from tests.util import run_cli

TINY = "gpt2-345m:seq=32,layers=2,hidden=64,heads=4,vocab=256,precision=fp32"
MAX_COMM_BYTES = 16 * 2**10


def _discover(*texts: str, cluster: str = "cpu-1x2") -> Discovery:
    c = load_cluster(cluster)
    return discover(load_model(TINY), c, [Strategy.from_str(t) for t in texts], AnalyticCosts(c))


def _families(report: str) -> set[str]:
    line = next(x for x in report.splitlines() if "families:" in x)
    return {f.rsplit(" ", 1)[0] for f in line.split("families: ", 1)[1].split(", ")}


# ------------------------------------------------------------------------------------------------------ discovery
@pytest.mark.parametrize("mode", ["recompute=full", "recompute=full recompute_layers=1", "recompute=selective"])
def test_recomputation_adds_no_event_to_measure(mode: str) -> None:
    plain = _discover("tp=1 pp=2 dp=1 mb=4")
    found = _discover(f"tp=1 pp=2 dp=1 mb=4 {mode}")
    assert set(found.measurable_compute) == set(plain.measurable_compute)
    assert found.events_total > plain.events_total  # the recomputed forwards are there, as events already measured
    if mode.endswith("selective"):  # the attention core: derived from the attention block's measured forward
        assert found.derived_compute and all(k.startswith("attention.core[") for k in found.derived_compute)
        assert set(found.compute) == set(plain.compute) | set(found.derived_compute)
    else:  # the forward runs again: the very same events
        assert set(found.compute) == set(plain.compute) and not found.derived_compute


def test_sequence_parallel_blocks_are_derived_from_the_measured_blocks() -> None:
    plain = _discover("tp=2 pp=1 dp=1 mb=2")
    sp = _discover("tp=2 pp=1 dp=1 mb=2 sp=1")
    assert set(sp.measurable_compute) == set(plain.measurable_compute)
    assert sp.derived_compute and all("+sp[" in k for k in sp.derived_compute)
    assert "6 derived from a measured block" in sp.report() and "derived" not in plain.report()
    assert _families(sp.report()) == {"all_gather intra", "reduce_scatter intra"}
    assert _families(plain.report()) == {"all_reduce intra"}


def test_profile_takes_the_scale_options_for_every_strategy_and_the_grid(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["profile", "--model", TINY, "--cluster", "cpu-1x2", "--dry-run"]
    code, _, err = run_cli([*base, "--strategy", "1M1P2D", "--strategy", "2M1P1D", "--optimizer-sharding", "zero1"],
                           capsys)  # fmt: skip
    assert code == 0 and _families(err) == {"all_gather intra", "reduce_scatter intra", "all_reduce intra"}
    # the grid (1M1P2D, 1M2P1D, 2M1P1D): sharding where dp > 1, sequence parallelism where tp > 1
    grid = [*base, "--grid-gpus", "2", "--global-batch", "4"]
    code, _, plain = run_cli(grid, capsys)
    assert code == 0 and {"reduce_scatter intra", "all_gather intra"}.isdisjoint(_families(plain))
    code, _, scaled = run_cli([*grid, "--sequence-parallel", "--optimizer-sharding", "zero1"], capsys)
    assert code == 0 and {"reduce_scatter intra", "all_gather intra"} <= _families(scaled)
    code, _, recomputed = run_cli([*grid, "--recompute", "full"], capsys)
    events = [int(r.split(": ", 1)[1].split(" per-GPU")[0].replace(",", "")) for r in (plain, recomputed)]
    assert code == 0 and events[1] > events[0]
    # an explicit strategy takes them as given: a tp=1 strategy cannot be sequence-parallel
    code, _, err = run_cli([*base, "--strategy", "1M1P2D", "--sequence-parallel"], capsys)
    assert code == 2 and "needs tp > 1" in err and len(err.strip().splitlines()) == 1


# --------------------------------------------------------------------------------------------- real gloo ranks
COLLECTIVES_RANK = """
import json, sys
import torch, torch.distributed as dist

rank, store, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
x = torch.arange(8, dtype=torch.float32) + rank
part, full = torch.empty(4), torch.empty(8)
names = {}
for collective, call in (("reduce_scatter", lambda: dist.reduce_scatter_single(part, x)),
                         ("all_gather", lambda: dist.all_gather_single(full, part))):
    with torch.autograd.profiler.profile(use_kineto=False) as prof:  # the gloo work it runs (kineto: 5 s to start)
        call()
    names[collective] = sorted({e.name for e in prof.function_events if e.name.startswith("gloo:")})
if rank == 0:
    open(out, "w").write(json.dumps({"names": names, "part": part.tolist(), "full": full.tolist()}))
dist.destroy_process_group()
"""
"""One of two gloo ranks: a reduce-scatter and an all-gather as the profiler calls them, checked and profiled."""


@pytest.mark.slow
def test_gloo_reduce_scatter_is_an_all_reduce_and_its_all_gather_its_own(tmp_path: Path) -> None:
    """What the profile's notes (distsim.profiler.comm.GLOO_NOTES) say, on the installed torch."""
    pytest.importorskip("torch")
    from distsim.profiler.comm import GLOO_NOTES

    out = tmp_path / "names.json"
    ranks = [subprocess.Popen([sys.executable, "-c", COLLECTIVES_RANK, str(r), str(tmp_path / "store"), str(out)],
                              stderr=subprocess.PIPE, text=True) for r in range(2)]  # fmt: skip
    try:
        for rank in ranks:
            _, err = rank.communicate(timeout=300)
            assert rank.returncode == 0, err
    finally:
        for rank in ranks:
            rank.kill()  # only one still running (its peer failed): a rank that ended is left alone
    got = json.loads(out.read_text())
    assert got["part"] == [1.0, 3.0, 5.0, 7.0]  # rank 0's half of x0 + x1 = 2 arange + 1
    assert got["full"] == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0, 15.0]
    assert got["names"] == {"reduce_scatter": ["gloo:all_reduce"], "all_gather": ["gloo:all_gather"]}
    assert "gloo:all_reduce" in GLOO_NOTES["reduce_scatter"] and "gloo:all_gather" in GLOO_NOTES["all_gather"]


def _distsim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "distsim", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_two_gloo_ranks_measure_and_fit_the_new_collectives_that_simulate_then_uses(tmp_path: Path) -> None:
    """ZeRO-1 over dp = 2 and sequence parallelism over tp = 2: their reduce-scatters and all-gathers are measured at
    the sizes they send (up to the largest size measured) and fitted; simulate costs them from the profile. Only
    communication is measured (compute stays analytic, which shows that the simulation lists analytic events)."""
    pytest.importorskip("torch")
    from distsim.profiler.comm import GLOO_NOTES

    out = tmp_path / "scale.json"
    strategies = ["tp=1 pp=1 dp=2", "tp=2 pp=1 dp=1 sp=1"]
    run = _distsim("profile", "--model", TINY, "--cluster", "cpu-1x2", "--strategy", strategies[0], "--strategy",
                   strategies[1], "--optimizer-sharding", "zero1", "--micro-batches", "2", "--emulate-nodes", "1",
                   "--procs-per-node", "2", "--no-compute", "--no-self-check", "--comm-repeats", "2",
                   "--max-comm-bytes", str(MAX_COMM_BYTES), "--out", str(out))  # fmt: skip
    assert run.returncode == 0, run.stderr
    db = load_profile(str(out))
    assert db.provenance["backend"] == "gloo" and not db.compute
    wanted = _discover(*(f"{s} zero=zero1 mb=2" for s in strategies))
    fits = {(f.collective, f.scope, f.group_size): f for f in db.fits}
    for collective in ("reduce_scatter", "all_gather"):
        sent = wanted.comm_groups[(collective, "intra", 2)]
        measured = [m for m in db.comm if m.group == (collective, "intra", 2)]
        assert {b for b in sent if b <= MAX_COMM_BYTES} <= {m.bytes for m in measured}
        assert any(b > MAX_COMM_BYTES for b in sent)  # the ZeRO bucket: from the fit
        assert fits[(collective, "intra", 2)].points == len(measured) >= 2
        assert {m.note for m in measured} == {GLOO_NOTES[collective]}

    # simulate: the strategies' reduce-scatters and all-gathers come from the profile, nothing analytic
    cluster = load_cluster("cpu-1x2")
    costs = ProfileCosts(db, AnalyticCosts(cluster), strict=True)
    sources: dict[str, str] = {}
    for key, event in wanted.comm.items():
        cost = costs.comm(event)
        sources[key] = cost.source
        if event.nbytes <= MAX_COMM_BYTES:
            assert cost.source == "measured"
            exact = db.comm_exact(event.collective, event.scope, event.group_size, event.nbytes)
            assert exact is not None and cost.seconds == exact.seconds
        else:
            fit = fits[(event.collective, event.scope, event.group_size)]
            assert cost.source == "fitted" and cost.seconds == fit.time_s(event.nbytes)
    assert set(sources.values()) == {"measured", "fitted"}
    seen: set[str] = set()
    for strategy in strategies:
        sim = _distsim("simulate", "--model", TINY, "--cluster", "cpu-1x2", "--strategy", strategy,
                       "--optimizer-sharding", "zero1", "--micro-batches", "2", "--profile", str(out),
                       "--json")  # fmt: skip
        assert sim.returncode == 0, sim.stderr
        result: dict[str, Any] = json.loads(sim.stdout)
        estimated = result["estimated_events"]
        assert estimated and all(not k.startswith(("reduce_scatter/", "all_gather/")) for k in estimated)
        seen |= set(result["event_sources"])
    assert seen == {"measured", "fitted", "analytic"}

    # profile show lists each fit with what gloo runs for it
    show = _distsim("profile", "show", str(out))
    assert show.returncode == 0, show.stderr
    lines = show.stdout.splitlines()
    for collective in ("reduce_scatter", "all_gather"):
        at = max(i for i, line in enumerate(lines) if line.strip().startswith(f"{collective} "))
        assert lines[at + 1].strip() == f"note: {GLOO_NOTES[collective]}"
