"""The memory model of issue 12: activation recomputation, sequence parallelism and ZeRO optimizer sharding.

Activation formulas are Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
Table 2 (per transformer layer, b = 1, 2-byte activations), which count the s x s attention scores an unfused or
fused-softmax attention core stores: the models here say ``attention="unfused"`` (flash attention, the default, keeps
no scores: tests/unit/test_attention_impl.py); the training state is Rajbhandari et al. 2020, "ZeRO",
Figure 1 (2 + 2 + K bytes per parameter, K = 12, partitioned over the d data-parallel replicas).
"""

from __future__ import annotations

import json

import pytest

from distsim import FlowOptions, Strategy, get_cluster, get_model
from distsim.core.errors import ModelFileError
from distsim.core.models import model_from_dict
from distsim.core.models.graph import Model
from distsim.core.models.transformer import decoder_only
from distsim.core.partition import ranges
from distsim.core.schedules import build_schedule
from distsim.sim.costs import AnalyticCosts
from distsim.sim.flow.events import resolve_partition
from distsim.sim.memory import MemoryEstimate, estimate_memory, layer_activations, recomputed_layers
from tests.util import run_cli

GB = 1e9


def table2(mode: str, sp: bool, s: int, h: int, a: int, t: int, b: int = 1) -> float:
    """Korthikanti et al. 2022, Table 2, activations per transformer layer in bytes; full recomputation's 2sbh
    shrinks to 2sbh/t with sequence parallelism (Sec. 5: each tp rank stores only its part of the layer input)."""
    sbh = s * b * h
    attention = 5 * a * s / h
    if mode == "none":
        return sbh / t * (34 + attention) if sp else sbh * (10 + 24 / t + attention / t)
    if mode == "selective":
        return sbh * 34 / t if sp else sbh * (10 + 24 / t)
    return 2 * sbh / t if sp else 2 * sbh


def tiny(layers: int = 4) -> Model:
    """A GPT with s = 8, h = 16, a = 4 (sbh = 128 per sequence, 5as/h = 10) and a 128-token vocabulary, its attention
    storing the scores (unfused), as Korthikanti's formulas count them."""
    return decoder_only("tiny", layers, 16, 4, 8, 128, source="test", attention="unfused")


MODES = [("none", False), ("none", True), ("selective", False), ("selective", True), ("full", False), ("full", True)]


@pytest.mark.parametrize(("mode", "sp"), MODES)
def test_table2_per_layer_on_a_hand_case(mode: str, sp: bool) -> None:
    """s = 8, h = 16, a = 4, t = 4: sbh = 128, 5as/h = 10, so sbh(10 + 6 + 2.5), sbh/4 (44), sbh(10 + 6),
    sbh 34/4, 2sbh and 2sbh/4."""
    by_hand = {
        ("none", False): 128 * 18.5,
        ("none", True): 128 * 11,
        ("selective", False): 128 * 16,
        ("selective", True): 128 * 8.5,
        ("full", False): 256,
        ("full", True): 64,
    }
    layer = layer_activations(tiny(), 1, 4, sp, mode)
    assert layer.stored == by_hand[mode, sp] == table2(mode, sp, 8, 16, 4, 4)
    assert layer.unrecomputed == table2("none", sp, 8, 16, 4, 4)
    assert layer.stored + layer.rebuilt == layer.unrecomputed


def test_no_parallelism_is_sbh_34_plus_5as_over_h() -> None:
    """Korthikanti Sec. 4.1: attention 11sbh + 5as^2b, MLP 19sbh, layer norms 4sbh: sbh(34 + 5as/h)."""
    assert layer_activations(tiny(), 1, 1, False, "none").stored == 128 * (34 + 10)


@pytest.mark.parametrize(
    ("mode", "sp", "expected"),
    [
        ("none", False, 578_813_952),  # sbh x 23: 10 + 24/8 + 80/8
        ("none", True, 358_612_992),  # sbh x 14.25: (34 + 80)/8
        ("selective", False, 327_155_712),  # sbh x 13
        ("selective", True, 106_954_752),  # sbh x 4.25
        ("full", False, 50_331_648),  # 2 sbh
        ("full", True, 6_291_456),  # 2 sbh / 8
    ],
)
def test_table2_at_gpt3_175b(mode: str, sp: bool, expected: int) -> None:
    """GPT-3 175B's layer (Brown et al. 2020, Table 2.1: h 12288, 96 heads, s 2048) at t = 8, b = 1: sbh = 25,165,824
    and 5as/h = 80, so per layer 0.58 GB with tensor parallelism only, 0.05 GB under full recomputation."""
    unfused = get_model("gpt3-175b:attention=unfused")  # the paper's runs stored the scores
    layer = layer_activations(unfused, 1, 8, sp, mode)
    assert layer.stored == expected == table2(mode, sp, 2048, 12288, 96, 8)
    assert layer_activations(unfused, 1, 1, False, "none").stored == 2048 * 12288 * 114


def _estimate(model: Model, strategy: Strategy, counts: tuple[int, ...]) -> list[MemoryEstimate]:
    return estimate_memory(model, strategy, build_schedule(strategy), ranges(counts), 80 * GB)


def test_pipeline_peak_under_each_mode_by_hand() -> None:
    """tiny(4) on 2 stages [embedding, l0, l1 | l2, l3, head], 1F1B with 4 micro-batches: K = 2, 1.
    Per sequence: embedding 128 (its dropout mask), a layer 44 x 128 = 5632 (none), 34 x 128 = 4352 (selective,
    rebuilding a 10 x 128 core), 256 (full, rebuilding 5632 - 256 = 5376); the embedding is not recomputed."""
    m, base = tiny(), Strategy(pp=2, num_micro_batches=4)
    none = _estimate(m, base, (3, 3))[0]
    assert (none.activations_bytes, none.recompute_bytes, none.in_flight_microbatches) == (2 * (128 + 2 * 5632), 0, 2)
    sel = _estimate(m, base.with_(recompute="selective"), (3, 3))[0]
    assert (sel.activations_bytes, sel.recompute_bytes) == (2 * (128 + 2 * 4352), 1280)
    full = _estimate(m, base.with_(recompute="full"), (3, 3))[0]
    assert (full.activations_bytes, full.recompute_bytes) == (2 * (128 + 2 * 256), 5376)
    assert full.unrecomputed_activations_bytes == none.activations_bytes
    assert full.recompute_saved_bytes == none.activations_bytes - 1280 - 5376
    one = _estimate(m, base.with_(recompute="full", recompute_layers=1), (3, 3))[0]
    assert (one.activations_bytes, one.recompute_bytes) == (2 * (128 + 256 + 5632), 5376)


def test_recompute_layers_takes_the_first_layers_of_each_virtual_stage() -> None:
    """Megatron's block method: the first N transformer layers of every (virtual) stage; the embedding and the LM
    head are never re-run by full recomputation, and selective recomputation picks layers with an attention core."""
    m = tiny(8)  # embedding 0, layers 1..8, head 9
    stages = ranges((3, 2, 2, 3))
    s = Strategy(pp=2, num_micro_batches=4, schedule="interleaved", recompute="full", recompute_layers=1)
    assert recomputed_layers(m, s, stages) == {1, 3, 5, 7}
    assert recomputed_layers(m, s.with_(recompute_layers=None), stages) == set(range(1, 9))
    assert recomputed_layers(m, s.with_(recompute="selective", recompute_layers=None), stages) == set(range(1, 9))
    assert recomputed_layers(m, s.with_(recompute="none", recompute_layers=None), stages) == set()


def _states(m: MemoryEstimate) -> tuple[float, float, float, float]:
    return m.params_bytes, m.grads_bytes, m.optimizer_bytes, m.gathered_params_bytes


def test_zero_split_by_hand() -> None:
    """Layers of 1000 and 3000 parameters, dp = 4, fp16 mixed precision (2 + 2 + 12 bytes per parameter): Psi = 4000
    (ZeRO Figure 1). zero3 also holds two whole layers' weights gathered: the computing one and one prefetched."""
    spec = {"name": "z", "layers": [{"name": "a", "forward_s": 1, "params": 1000},
                                    {"name": "b", "forward_s": 1, "params": 3000}]}  # fmt: skip
    m, s = model_from_dict(spec), Strategy(dp=4)
    expected = {
        "none": (8000, 8000, 48000, 0),
        "zero1": (8000, 8000, 12000, 0),
        "zero2": (8000, 2000, 12000, 0),
        "zero3": (2000, 2000, 12000, 2 * 3000 * 2),
    }
    for zero, parts in expected.items():
        est = _estimate(m, s.with_(optimizer_sharding=zero), (2,))[0]
        assert _states(est) == parts
        assert est.unsharded_states_bytes == 64000 and est.sharding_saved_bytes == 64000 - sum(parts)
    fp32 = model_from_dict({**spec, "precision": "fp32"})  # 4 + 4 + 8 bytes per parameter
    assert _states(_estimate(fp32, s.with_(optimizer_sharding="zero1"), (2,))[0]) == (16000, 16000, 8000, 0)
    # one replica: nothing to shard, nothing to gather
    assert _states(_estimate(m, Strategy(optimizer_sharding="zero3"), (2,))[0]) == (8000, 8000, 48000, 0)


CONFIGS = [
    ("tiny", {"pp": 2, "num_micro_batches": 4}),
    ("tiny", {"tp": 2, "pp": 2, "num_micro_batches": 4, "schedule": "gpipe"}),
    ("tiny", {"tp": 4, "pp": 2, "dp": 2, "num_micro_batches": 8, "schedule": "interleaved"}),
    ("gpt3-1.3b", {"tp": 2, "pp": 4, "dp": 4, "num_micro_batches": 8}),
    ("t5-base", {"pp": 2, "dp": 2, "num_micro_batches": 4}),
    ("resnet50", {"pp": 2, "dp": 4, "num_micro_batches": 4}),
]


def _case(name: str, kw: dict[str, object]) -> tuple[Model, Strategy, tuple[int, ...]]:
    """The model, the strategy and layers per (virtual) stage as even as they go (the first stages take the rest)."""
    m = tiny() if name == "tiny" else get_model(name)
    s = Strategy(**kw)  # type: ignore[arg-type]
    n, k = m.num_layers, s.num_stages
    return m, s, tuple(n // k + (i < n % k) for i in range(k))


@pytest.mark.parametrize(("name", "kw"), CONFIGS)
def test_recomputation_never_needs_more_activation_memory(name: str, kw: dict[str, object]) -> None:
    m, strategy, counts = _case(name, kw)
    for sp in (False, True) if strategy.tp > 1 else (False,):
        base = strategy.with_(sequence_parallel=sp)
        peak = {mode: _estimate(m, base.with_(recompute=mode), counts) for mode in ("none", "selective", "full")}
        for r in range(base.pp):
            full, sel, none = (peak[x][r].all_activations_bytes for x in ("full", "selective", "none"))
            assert full <= sel <= none  # equal for a CNN's selective: it has no attention core
            previous = none
            for n in (1, 2, 3, None):
                mid = _estimate(m, base.with_(recompute="full", recompute_layers=n), counts)[r].all_activations_bytes
                assert full <= mid <= previous
                previous = mid
            assert previous == full


@pytest.mark.parametrize(("name", "kw"), CONFIGS)
def test_sharding_never_increases_state_memory(name: str, kw: dict[str, object]) -> None:
    m, base, counts = _case(name, kw)
    states = {z: [e.states_bytes for e in _estimate(m, base.with_(optimizer_sharding=z), counts)]
              for z in ("none", "zero1", "zero2", "zero3")}  # fmt: skip
    for r in range(base.pp):
        assert states["zero2"][r] <= states["zero1"][r] <= states["none"][r]
        assert states["zero3"][r] <= states["none"][r]
        if base.dp > 1:
            assert states["zero1"][r] < states["none"][r]


def test_sequence_parallelism_divides_everything_by_t() -> None:
    """With sp every part of a transformer layer's activations divides by t (Sec. 4.2.2), at any tp."""
    m = tiny()
    for tp in (2, 4):
        assert layer_activations(m, 2, tp, True, "none").stored * tp == layer_activations(m, 2, 1, False, "none").stored


def test_other_layers_keep_their_input_under_full_recomputation() -> None:
    """Rule for non-transformer layers: full recomputation keeps the outputs of its input layers, or its own
    activations when smaller; the first layer (fed by the data batch) keeps nothing; selective changes nothing."""
    spec = {"name": "c", "layers": [
        {"name": "conv", "forward_s": 1, "out_bytes": 300, "saved_bytes": 500},
        {"name": "pool", "forward_s": 1, "out_bytes": 100, "saved_bytes": 400},
        {"name": "cat", "forward_s": 1, "out_bytes": 400, "inputs": ["conv", "pool"]},
        {"name": "fc", "forward_s": 1, "out_bytes": 10, "saved_bytes": 1000, "inputs": ["cat", "pool"]},
    ]}  # fmt: skip
    m = model_from_dict(spec)
    assert [layer_activations(m, i, 1, False, "full").stored for i in range(4)] == [0, 300, 0, 500]
    assert [layer_activations(m, i, 1, False, "selective").stored for i in range(4)] == [500, 400, 0, 1000]
    resnet = get_model("resnet50")
    i = 2
    (src,) = resnet.input_layers[i]
    assert layer_activations(resnet, i, 1, False, "full").stored == min(
        resnet.layers[src].out_bytes, resnet.layers[i].saved_bytes
    )


def test_model_file_layers_can_say_what_selective_and_sp_change() -> None:
    spec = {"name": "f", "layers": [
        {"name": "a", "forward_s": 1, "out_bytes": 64},
        {"name": "b", "flops": 1e6, "params": 64, "tp": "shard", "out_bytes": 64, "saved_bytes": 100,
         "saved_sp_bytes": 60, "saved_sharded_bytes": 200, "saved_core_bytes": 80},
    ]}  # fmt: skip
    m = model_from_dict(spec)
    assert layer_activations(m, 1, 2, False, "none").stored == 100 + 100
    assert layer_activations(m, 1, 2, True, "none").stored == 40 + 30 + 100
    assert layer_activations(m, 1, 2, True, "selective").stored == 40 + 30 + 60
    assert layer_activations(m, 1, 2, True, "full").stored == 32  # its input, sequence-sharded
    with pytest.raises(ModelFileError, match="saved_core_bytes must not exceed"):
        model_from_dict({"name": "bad", "layers": [{"name": "x", "saved_sharded_bytes": 1, "saved_core_bytes": 2}]})


def test_summary_and_json_show_each_part(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "gpt2-345m", "--cluster", "distsim-testbed", "--strategy",
            "tp=2 pp=4 dp=2 mb=8 recompute=full sp=1 zero=zero1"]  # fmt: skip
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    line = next(x for x in out.splitlines() if "memory parts" in x)
    for needle in ("params", "grads", "optimizer", "(zero1: -", "kept", "rebuilding one layer",
                   "(recompute full: -", "sequence parallel"):  # fmt: skip
        assert needle in line
    code, out, err = run_cli([*args, "--json"], capsys)
    rank = json.loads(out)["memory_per_rank"][0]
    assert rank["recompute"] == "full" and rank["optimizer_sharding"] == "zero1" and rank["sequence_parallel"]
    parts = rank["states_bytes"] + rank["activations_bytes"] + rank["recompute_bytes"]
    assert rank["total_bytes"] == pytest.approx(parts)
    assert rank["recompute_saved_bytes"] > 0 and rank["sharding_saved_bytes"] > 0


def test_grid_memory_filter_follows_the_strategy() -> None:
    """The grid's filter is estimate_memory's verdict, so recomputation and sharding make GPT-3 175B configurations
    fit that do not without them (with the stored-score attention of Narayanan et al. 2021's runs)."""
    from distsim.search.grid import evaluate

    model, cluster = get_model("gpt3-175b:attention=unfused"), get_cluster("dgx-a100")
    s = Strategy.from_str("8M8P16D", num_micro_batches=96)
    costs = AnalyticCosts(cluster)
    plain = evaluate(model, cluster, s, costs, FlowOptions())
    assert not plain.fits and not plain.simulated and plain.peak_memory_bytes > 80 * GB
    both = evaluate(model, cluster, s.with_(recompute="full", optimizer_sharding="zero1"), costs, FlowOptions())
    assert both.fits and both.simulated and both.peak_memory_bytes < 40 * GB


def test_gpt3_175b_8m16p8d_under_each_mode(capsys: pytest.CaptureFixture[str]) -> None:
    """GPT-3 175B on dgx-a100 (1024 A100 80 GB) as 8M16P8D, M = 64, 1F1B: printed for the report, not asserted
    beyond the order of the modes."""
    model, cluster = get_model("gpt3-175b"), get_cluster("dgx-a100")
    base = Strategy.from_str("8M16P8D", num_micro_batches=64)
    counts = resolve_partition(model, base, AnalyticCosts(cluster))
    rows = []
    for label, changes in [
        ("none", {}),
        ("selective", {"recompute": "selective"}),
        ("full", {"recompute": "full"}),
        ("none + sp", {"sequence_parallel": True}),
        ("selective + sp", {"recompute": "selective", "sequence_parallel": True}),
        ("full + sp", {"recompute": "full", "sequence_parallel": True}),
        ("none + zero1", {"optimizer_sharding": "zero1"}),
        ("selective + zero1", {"recompute": "selective", "optimizer_sharding": "zero1"}),
        ("full + zero1", {"recompute": "full", "optimizer_sharding": "zero1"}),
        (
            "selective + sp + zero1",
            {"recompute": "selective", "sequence_parallel": True, "optimizer_sharding": "zero1"},
        ),
    ]:
        s = base.with_(**changes)
        est = estimate_memory(model, s, build_schedule(s), counts, cluster.gpu.memory_bytes)
        worst = max(est, key=lambda e: e.total_bytes)
        rows.append((label, worst))
    with capsys.disabled():
        print(f"\nGPT-3 175B, dgx-a100 1024 GPUs, 8M16P8D, M=64, 1F1B, layers per stage {[e - b for b, e in counts]}")
        for label, w in rows:
            print(f"  {label:24s} peak {w.total_bytes / GB:6.2f} GB on rank {w.rank:2d} "
                  f"(states {w.states_bytes / GB:5.2f}, activations {w.all_activations_bytes / GB:5.2f}; "
                  f"{w.describe_parts(GB)})")  # fmt: skip
    totals = {label: w.total_bytes for label, w in rows}
    assert totals["full"] < totals["selective"] < totals["none"]
    assert totals["none + zero1"] < totals["none"]
