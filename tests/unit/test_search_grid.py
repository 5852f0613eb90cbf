"""DistSim's grid search: enumeration you can count by hand, the memory filter, ranking, parallel == serial."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from distsim import AnalyticCosts, Strategy, get_cluster, get_model, simulate
from distsim.core.cluster import Cluster
from distsim.core.errors import DistsimError
from distsim.core.models import Model
from distsim.search.grid import GridSpec, grid_search
from distsim.search.space import cluster_for, enumerate_strategies
from tests.util import run_cli


def test_distsim_use_case_has_15_settings() -> None:
    """BERT-exLarge on 16 GPUs at global batch 16: MP, PP in {1,2,4,8,16}, DP = 16/(MP PP): 5+4+3+2+1 = 15."""
    valid, skipped = enumerate_strategies(get_model("bert-exlarge"), get_cluster("distsim-a10"), 16, 16)
    assert len(valid) == 15 and not skipped
    assert {(s.tp, s.pp, s.dp) for s in valid} == {
        (m, p, 16 // (m * p)) for m in (1, 2, 4, 8, 16) for p in (1, 2, 4, 8, 16) if m * p <= 16
    }
    assert all(s.global_batch_size == 16 for s in valid)


def test_enumeration_counted_by_hand() -> None:
    """4 GPUs, global batch 4, mbs 1 or 2, GPipe or 1F1B; (tp, pp, dp) in 6 triples, 24 combinations.

    (1,1,4): mbs 1 GPipe only (1F1B = GPipe without a pipeline; mbs 2 needs 8 samples): 1.
    (1,2,2), (1,4,1), (2,2,1): both mbs, both schedules: 4 each.   (2,1,2), (4,1,1): GPipe at mbs 1 and 2: 2 each.
    17 valid; 7 skipped: 6 'same as gpipe' (1F1B without a pipeline is GPipe) and (1,1,4) GPipe at mbs 2.
    """
    model = get_model("gpt2-cpu")  # 4 layers, 8 heads, hidden 512: tp 1, 2, 4 all divide
    valid, skipped = enumerate_strategies(model, get_cluster("distsim-testbed"), 4, 4, (1, 2), ("gpipe", "1f1b"))
    assert len(valid) == 17 and len(skipped) == 7 and len(valid) + len(skipped) == 24
    reasons = sorted(k.reason.split(":")[0].split(" is not")[0] for k in skipped)
    assert reasons.count("same as gpipe") == 6
    assert [str(k) for k in skipped if "divisible" in k.reason] == [
        "1M1P4D mbs=2 gpipe: global batch 4 is not divisible by dp x mbs = 4 x 2"
    ]


def test_pipeline_degrees_must_divide_the_transformer_layers_unless_uneven_stages() -> None:
    model = get_model("bert-exlarge:layers=6")  # 8 layers: embedding, 6 transformer layers, head
    cluster = get_cluster("distsim-a10")
    valid, skipped = enumerate_strategies(model, cluster, 16, 16, tp_degrees=(1,))
    assert sorted(s.pp for s in valid) == [1, 2]
    assert {k.pp for k in skipped} == {4, 8, 16}
    assert "pp=4 does not divide the 6 transformer layers" in next(k.reason for k in skipped if k.pp == 4)
    assert "pp=16 exceeds the 8 layers" in next(k.reason for k in skipped if k.pp == 16)
    valid, _ = enumerate_strategies(model, cluster, 16, 16, tp_degrees=(1,), even_stages=False)
    assert sorted(s.pp for s in valid) == [1, 2, 4, 8]


def test_interleaved_needs_pp_times_chunks_to_divide_the_layers() -> None:
    model = get_model("bert-exlarge:layers=12")  # 14 graph layers: embedding, 12 blocks, head
    valid, skipped = enumerate_strategies(model, get_cluster("distsim-a10"), 16, 64, (1,), ("interleaved",),
                                          tp_degrees=(1,))  # fmt: skip
    assert sorted(s.pp for s in valid) == [2]
    reasons = {k.pp: k.reason for k in skipped}
    assert "pp x v = 4 x 2 does not divide the 12" in reasons[4]
    assert "exceeds the 14 layers" in reasons[8]


def test_gpu_counts_the_cluster_does_not_have() -> None:
    cluster = get_cluster("distsim-a10")
    with pytest.raises(DistsimError, match=r"has 16 GPUs .* not 32; pass --nodes 8"):
        cluster_for(cluster, 32)
    with pytest.raises(DistsimError, match="not a whole number"):
        cluster_for(cluster, 6)
    assert cluster_for(cluster, 8).num_gpus == 8


def test_a_micro_batch_size_that_does_not_divide_the_global_batch_is_an_error() -> None:
    with pytest.raises(DistsimError, match="global batch 16 is not divisible by micro-batch size 3"):
        grid_search(get_model("bert-exlarge"), get_cluster("distsim-a10"), GridSpec(16, 16, micro_batch_sizes=(1, 3)))


def test_nothing_valid_is_an_error_naming_why() -> None:
    with pytest.raises(DistsimError, match="no valid configuration"):
        grid_search(get_model("gpt2-cpu"), get_cluster("distsim-testbed"), GridSpec(16, 16, pp_degrees=(16,),
                                                                                    tp_degrees=(1,)))  # fmt: skip


def test_memory_filter_when_nothing_fits() -> None:
    """GPT-3 175B on 8 GPUs needs 175e9 x 16 B / 8 = 350 GB per GPU for training state alone."""
    r = grid_search(get_model("gpt3-175b"), get_cluster("dgx-a100"), GridSpec(8, 8, tp_degrees=(8,)))
    assert r.points and not any(p.fits or p.simulated for p in r.points)
    assert all(p.peak_memory_bytes > 350e9 and math.isnan(p.iteration_time_s) for p in r.points)
    assert r.best() == [] and (r.table()["samples_per_s"] == 0).all()


def test_memory_filter_drops_exactly_what_does_not_fit() -> None:
    model = get_model("bert-exlarge")
    small = replace(get_cluster("distsim-a10"), gpu=replace(get_cluster("distsim-a10").gpu, memory_bytes=4e9))
    r = grid_search(model, small, GridSpec(16, 16))
    assert 0 < r.num_out_of_memory < len(r.points)
    for p in r.points:
        assert p.fits == (p.peak_memory_bytes <= 4e9)
        assert p.simulated == p.fits
    table = r.table()
    assert list(table["fits"]) == sorted(table["fits"], reverse=True)  # everything that fits ranks first
    unfiltered = grid_search(model, small, replace(GridSpec(16, 16), memory_filter=False))
    assert all(p.simulated for p in unfiltered.points)
    assert [p.fits for p in unfiltered.points] == [p.fits for p in r.points]


def test_ranking_is_by_simulated_iteration_time() -> None:
    model, cluster = get_model("bert-exlarge"), get_cluster("distsim-a10")
    r = grid_search(model, cluster, GridSpec(16, 16, micro_batch_sizes=(1, 2), schedules=("gpipe", "1f1b")))
    times = [p.iteration_time_s for p in r.ranked()]
    assert times == sorted(times)
    best = r.best()[0]
    assert best.iteration_time_s == simulate(model, cluster, best.strategy).iteration_time_s
    table = r.table()
    assert list(table["rank"]) == list(range(1, len(table) + 1))
    assert table["samples_per_s"].iloc[0] == pytest.approx(16 / best.iteration_time_s)


def test_parallel_search_returns_exactly_the_serial_result(gpt2: Model, testbed: Cluster) -> None:
    model, cluster = gpt2, testbed
    spec = GridSpec(16, 32, micro_batch_sizes=(1, 2), schedules=("gpipe", "1f1b", "interleaved"))
    costs = AnalyticCosts(cluster)
    serial = grid_search(model, cluster, spec, costs, workers=1)
    seen: list[int] = []
    parallel = grid_search(model, cluster, spec, costs, workers=2, progress=lambda d, t, p: seen.append(d))
    assert parallel.workers == 2 and serial.workers == 1
    assert parallel.points == serial.points
    assert seen == list(range(1, len(serial.points) + 1))
    assert parallel.table().equals(serial.table())


def test_grid_tries_every_recompute_and_sharding_mode_where_it_differs(capsys: pytest.CaptureFixture[str]) -> None:
    from distsim.search.grid import with_memory_modes

    both = [Strategy(dp=2), Strategy(pp=2)]
    got = with_memory_modes(both, ("none", "full"), ("none", "zero1"))
    assert [(s.dp, s.recompute, s.optimizer_sharding) for s in got] == [
        (2, "none", "none"), (2, "none", "zero1"), (2, "full", "none"), (2, "full", "zero1"),
        (1, "none", "none"), (1, "full", "none"),  # dp = 1: nothing to shard
    ]  # fmt: skip
    code, _, err = run_cli(["search", "grid", "--model", "gpt2-cpu", "--cluster", "cpu-1x2", "--global-batch", "4",
                            "--recompute", "none,sometimes"], capsys)  # fmt: skip
    assert code == 2 and "--recompute 'none,sometimes': choose from none, selective, full" in err
