"""Transformer zoo against published sizes, model files, and the memory estimate."""

from __future__ import annotations

import pytest

from distsim import Strategy, get_cluster, get_model, simulate
from distsim.core.errors import ModelFileError, StrategyError, UnknownNameError
from distsim.core.models import ZOO, Model, model_from_dict
from tests.util import chain_model, hand_cluster


@pytest.mark.parametrize(
    ("name", "published", "tolerance"),
    [
        ("bert-large", 340e6, 0.03),  # Devlin et al.: 340M
        ("bert-exlarge", 640e6, 0.03),  # DAPPLE Table VIII: BERT-48 640M
        ("gpt2-345m", 345e6, 0.04),  # Megatron's "345M" (355M with its padded vocabulary)
        ("t5-base", 220e6, 0.03),  # Raffel et al.: 220M
        ("gpt3-1.3b", 1.3e9, 0.02),  # Brown et al. Table 2.1
        ("gpt3-6.7b", 6.7e9, 0.02),
        ("gpt3-13b", 13.0e9, 0.02),
        ("gpt3-175b", 175.0e9, 0.01),
    ],
)
def test_transformer_sizes_match_publications(name: str, published: float, tolerance: float) -> None:
    assert get_model(name).params == pytest.approx(published, rel=tolerance)


def test_megatron_flops_per_layer() -> None:
    """Narayanan et al. 2021: a layer's forward is 24 s h^2 + 4 s^2 h FLOPs per sequence."""
    m = get_model("gpt3-175b")
    s, h = 2048, 12288
    assert m.layers[1].fwd_flops == 24 * s * h * h + 4 * s * s * h


def test_t5_is_a_dag_whose_cuts_carry_the_encoder_output() -> None:
    m = get_model("t5-base")
    assert not m.is_chain
    cut = m.index["dec3"]  # a cut inside the decoder carries its hidden state and the encoder output
    assert m.boundary_bytes[cut] == 128 * 768 * 2 + 512 * 768 * 2


def test_every_zoo_model_builds_and_lists_its_source() -> None:
    for name, entry in ZOO.items():
        m = entry.build()
        assert m.name == name and m.source and m.num_layers >= 20


def test_unknown_model_suggests_a_name() -> None:
    with pytest.raises(UnknownNameError, match="did you mean 'bert-large'"):
        get_model("bert-larg")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "expected a mapping"),
        ({"name": "x"}, "needs 'layers'"),
        ({"layers": [{"name": "a", "forwad_s": 1}]}, "unknown key 'forwad_s'"),
        ({"layers": [{"name": "a", "forward_s": "slow"}]}, "forward_s must be a number"),
        ({"layers": [{"name": "a", "forward_s": -1}]}, "forward_s must be >= 0"),
        ({"layers": [{"name": "a"}, {"name": "a"}]}, "layer name 'a' is used twice"),
        ({"layers": [{"name": "a", "inputs": ["b"]}, {"name": "b"}]}, "takes input 'b', which comes later"),
        ({"layers": [{"name": "a", "tp": "diagonal"}]}, "tp must be shard, replicate or none"),
        ({"transformer": {"layers": 2, "hidden": 64}}, "transformer needs heads, seq, vocab"),
        ({"precision": "int3", "layers": [{"name": "a"}]}, "precision must be one of"),
    ],
)
def test_model_file_errors(data: object, message: str) -> None:
    with pytest.raises(ModelFileError, match=message):
        model_from_dict(data)


def test_model_file_repeat_and_transformer_shorthand() -> None:
    m = model_from_dict(
        {
            "name": "mix",
            "transformer": {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 100},
            "layers": [{"name": "extra", "forward_s": 0.1, "repeat": 3}],
        }
    )
    names = [layer.name for layer in m.layers]
    assert names == ["embedding", "layer0", "layer1", "lm_head", "extra0", "extra1", "extra2"]
    assert dict(m.tp_constraints)["attention heads"] == 4


def test_activation_memory_counts_in_flight_microbatches() -> None:
    """1F1B keeps K_i = S - i micro-batches on stage i; GPipe keeps all M (DAPPLE Sec. III-B)."""
    model = model_from_dict(
        {
            "name": "mem",
            "layers": [{"name": f"l{i}", "forward_s": 1, "params": 100, "saved_bytes": 1000.0} for i in range(4)],
        }
    )
    cluster = hand_cluster(1, 4)
    one = simulate(model, cluster, Strategy(pp=4, num_micro_batches=8, schedule="1f1b"))
    gp = simulate(model, cluster, Strategy(pp=4, num_micro_batches=8, schedule="gpipe"))
    assert [m.in_flight_microbatches for m in one.memory] == [4, 3, 2, 1]
    assert [m.activations_bytes for m in one.memory] == [4000, 3000, 2000, 1000]
    assert [m.in_flight_microbatches for m in gp.memory] == [8, 8, 8, 8]
    assert one.memory[0].params_bytes == 100 * 2 and one.memory[0].optimizer_bytes == 100 * 12
    assert one.peak_memory_bytes == 4000 + 100 * 16


def test_tied_embedding_is_stored_once_per_rank(gpt2: Model) -> None:
    m = gpt2
    whole = simulate(m, hand_cluster(1, 1), Strategy())
    split = simulate(m, hand_cluster(1, 2), Strategy(pp=2))
    head = m.layers[-1]
    assert head.tied_to == "embedding"
    assert whole.memory[0].params_bytes == m.params * 2
    assert head.shared_params == head.params - 2 * 1024  # the vocabulary matrix; its final LayerNorm is its own
    # the last stage keeps a copy of the shared matrix
    assert sum(x.params_bytes for x in split.memory) == (m.params + head.shared_params) * 2


def test_partly_tied_layer_stores_and_all_reduces_only_the_shared_weights() -> None:
    """A head of 50 parameters, 40 of them the embedding's (a torch module's final LayerNorm + tied LM head)."""
    spec = [{"name": "emb", "forward_s": 1.0, "params": 100},
            {"name": "head", "forward_s": 1.0, "params": 50, "tied_to": "emb", "tied_params": 40}]  # fmt: skip
    m = model_from_dict({"name": "tied", "layers": spec})
    assert m.params == 110 and m.rank_params([0, 1], 1) == 110 and m.rank_params([1], 1) == 50
    split = simulate(m, hand_cluster(1, 2), Strategy(pp=2))
    assert [x.params_bytes for x in split.memory] == [100 * 2, 50 * 2]
    tied = split.timeline.df[split.timeline.df["name"].str.startswith("tied grads")]
    assert len(tied) > 0
    # 40 shared parameters of 2-byte gradients over a 1000 B/s link: 2 (N-1)/N x 80 B = 80 B -> 0.08 s
    assert (tied["end_s"] - tied["start_s"]).max() == pytest.approx(0.08)
    with pytest.raises(ModelFileError, match="tied_params"):
        model_from_dict({"name": "bad", "layers": [spec[0], {**spec[1], "tied_params": 51}]})


def test_a_model_profiled_at_one_micro_batch_size_refuses_another() -> None:
    m = model_from_dict({"name": "mine", "micro_batch_size": 2, "layers": [{"name": "l", "forward_s": 1.0}]})
    assert simulate(m, hand_cluster(1, 1), Strategy(micro_batch_size=2)).iteration_time_s == pytest.approx(3.0)
    with pytest.raises(StrategyError, match="profiled at micro-batch size 2"):
        simulate(m, hand_cluster(1, 1), Strategy(micro_batch_size=4))


def test_out_of_memory_verdict() -> None:
    r = simulate(get_model("gpt3-175b"), get_cluster("dgx-a100").with_nodes(1), Strategy(tp=8, num_micro_batches=1))
    assert not r.fits_in_memory and r.peak_memory_bytes > 80e9
    ok = simulate(get_model("gpt2-345m"), get_cluster("dgx-a100").with_nodes(1), Strategy(dp=8))
    assert ok.fits_in_memory


def test_given_times_scale_with_tp_only_when_sharded() -> None:
    model = chain_model([(1.0, 2.0, 0, 0.0)])
    r = simulate(model, hand_cluster(1, 1), Strategy())
    assert r.iteration_time_s == pytest.approx(3.0)
    assert get_cluster("dapple-a").nodes == 2
