"""``--model hf:PATH``: a Hugging Face config.json, written by transformers' own config classes, becomes the model its
shapes describe (the zoo's where they match); unsupported families and malformed configs are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from distsim.core.errors import ModelFileError
from distsim.core.models import Model, get_model
from distsim.core.models.hf import model_from_hf_config, split_hf_spec
from distsim.core.models.transformer import pad_vocab
from distsim.io.files import is_model_profile, load_model
from tests.util import run_cli

transformers = pytest.importorskip("transformers")

TINY_LLAMA = {
    "hidden_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 688,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "tie_word_embeddings": False,
}
LLAMA3_8B = {  # meta-llama/Meta-Llama-3-8B's config.json
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}


def _write(tmp_path: Path, config: Any, name: str = "config.json") -> Path:
    path = tmp_path / name
    config.to_json_file(str(path))
    return path


def _raw(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _same(a: Model, b: Model) -> None:
    """Same graph: every layer (blocks, shapes, parameters, activations), constraints, sequence and precision."""
    assert a.params == b.params
    assert [(x.name, [blk.shape for blk in x.blocks]) for x in a.layers] == [
        (x.name, [blk.shape for blk in x.blocks]) for x in b.layers
    ]
    assert a.layers == b.layers
    assert (a.tp_constraints, a.seq_len, a.precision, a.pipeline_layers) == (
        b.tp_constraints,
        b.seq_len,
        b.precision,
        b.pipeline_layers,
    )


def test_tiny_llama_is_the_matching_zoo_spec(tmp_path: Path) -> None:
    path = _write(tmp_path, transformers.LlamaConfig(**TINY_LLAMA))
    model = load_model(f"hf:{path}")
    # LlamaConfig's max_position_embeddings is 2048, below the 4096 cap
    spec = get_model("llama3-8b:layers=2,hidden=256,heads=8,kv_heads=2,ffn=688,vocab=1000,seq=2048")
    _same(model, spec)
    assert model.name == f"hf:llama:{tmp_path.name}"
    assert str(path) in model.source and "model_type llama" in model.source
    assert "GQA 2 kv heads, swiglu, rmsnorm, rope, untied, no bias, no dropout" in model.description


def test_directory_and_overrides(tmp_path: Path) -> None:
    transformers.LlamaConfig(**TINY_LLAMA, dtype="float32").save_pretrained(str(tmp_path / "tiny"))
    model = load_model(f"hf:{tmp_path / 'tiny'}:seq=512,layers=3")
    _same(model, get_model("llama3-8b:layers=3,hidden=256,heads=8,kv_heads=2,ffn=688,vocab=1000,seq=512,"
                           "precision=fp32"))  # fmt: skip
    assert model.name == "hf:llama:tiny:layers=3,seq=512"
    assert load_model(f"hf:{tmp_path / 'tiny'}:precision=fp16-mixed").precision.name == "fp16-mixed"


@pytest.mark.parametrize(("dtype", "precision"), [("bfloat16", "bf16-mixed"), ("float16", "fp16-mixed"),
                                                  ("float32", "fp32"), (None, "bf16-mixed")])  # fmt: skip
@pytest.mark.parametrize("key", ["dtype", "torch_dtype"])
def test_dtype_gives_the_precision(tmp_path: Path, dtype: str | None, precision: str, key: str) -> None:
    config = _raw(_write(tmp_path, transformers.LlamaConfig(**TINY_LLAMA)))
    config.pop("dtype", None)
    config[key] = dtype
    assert model_from_hf_config(config, "c.json", {}).precision.name == precision


def test_gpt2_default_config_is_gpt2_124m(tmp_path: Path) -> None:
    path = _write(tmp_path, transformers.GPT2Config())
    model = load_model(f"hf:{path}")
    # GPT-2 small: 124,439,808 parameters with its 50,257-token vocabulary; distsim pads the vocabulary to a
    # multiple of 128 as Megatron does (50,304), and the LM head is tied to the embedding, so 47 x 768 more
    padded = 124_439_808 + (pad_vocab(50257) - 50257) * 768
    assert pad_vocab(50257) == 50304 and model.params == padded == 124_475_904
    unpadded = model.params - (pad_vocab(50257) - 50257) * 768
    assert abs(unpadded - 124.44e6) / 124.44e6 < 1e-3
    assert model.seq_len == 1024 and model.precision.name == "bf16-mixed"
    assert model.description.startswith("12 layers, h=768, heads=12, seq=1024, vocab=50257 (")  # GPT's defaults
    # the zoo's GPT builder with GPT-2 small's shapes gives the same graph
    _same(model, get_model("gpt2-345m:layers=12,hidden=768,heads=12,precision=bf16-mixed"))


def test_gpt2_n_inner_and_untied(tmp_path: Path) -> None:
    path = _write(tmp_path, transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, n_inner=256,
                                                    tie_word_embeddings=False, n_positions=256))  # fmt: skip
    model = load_model(f"hf:{path}")
    _same(model, get_model("gpt2-345m:layers=2,hidden=128,heads=4,ffn=256,seq=256,tied_embeddings=0,"
                           "precision=bf16-mixed"))  # fmt: skip
    with pytest.raises(ModelFileError, match="longer than the learned position table"):
        load_model(f"hf:{path}:seq=512")


def test_llama3_8b_real_config_is_the_zoo_model(tmp_path: Path) -> None:
    path = _write(tmp_path, transformers.LlamaConfig(**LLAMA3_8B, dtype="bfloat16"))
    model = load_model(f"hf:{path}")
    zoo = get_model("llama3-8b")
    assert model.params == zoo.params == 8_030_261_248
    assert model.seq_len == 4096  # min(max_position_embeddings 8192, 4096)
    _same(model, get_model("llama3-8b:seq=4096"))
    _same(load_model(f"hf:{path}:seq=8192"), zoo)
    # the same figures as a raw config of an older transformers (torch_dtype, no head_dim)
    raw = {"model_type": "llama", "torch_dtype": "bfloat16", "_name_or_path": "meta-llama/Meta-Llama-3-8B",
           **LLAMA3_8B}  # fmt: skip
    built = model_from_hf_config(raw, "config.json", {"seq": "8192"})
    _same(built, zoo)
    assert built.name == "hf:llama:meta-llama/Meta-Llama-3-8B:seq=8192"


def test_mistral_is_llama_shaped(tmp_path: Path) -> None:
    path = _write(tmp_path, transformers.MistralConfig(**TINY_LLAMA, head_dim=32, sliding_window=1024))
    model = load_model(f"hf:{path}:seq=2048")
    _same(model, get_model("llama3-8b:layers=2,hidden=256,heads=8,kv_heads=2,ffn=688,vocab=1000,seq=2048"))
    assert model.name.startswith("hf:mistral:")
    assert "sliding-window attention (window 1024) is modelled as full causal attention" in model.description
    assert "approximated" not in load_model(f"hf:{path}:seq=1024").description


def test_qwen2_leaves_out_the_qkv_biases_and_says_so(tmp_path: Path) -> None:
    path = _write(tmp_path, transformers.Qwen2Config(**TINY_LLAMA, max_position_embeddings=32768))
    model = load_model(f"hf:{path}")
    _same(model, get_model("llama3-8b:layers=2,hidden=256,heads=8,kv_heads=2,ffn=688,vocab=1000,seq=4096"))
    qkv_biases = (8 + 2 * 2) * 32
    for text in (model.description, model.source):
        assert f"approximated: Qwen2's Q/K/V projection biases ({qkv_biases:,} parameters per layer)" in text


def test_llama_biases(tmp_path: Path) -> None:
    both = model_from_hf_config({"model_type": "llama", **TINY_LLAMA, "max_position_embeddings": 128,
                                 "attention_bias": True, "mlp_bias": True}, "c.json")  # fmt: skip
    assert both.layers == get_model("llama3-8b:layers=2,hidden=256,heads=8,kv_heads=2,ffn=688,vocab=1000,seq=128,"
                                    "bias=1").layers  # fmt: skip
    mixed = model_from_hf_config({"model_type": "llama", **TINY_LLAMA, "max_position_embeddings": 128,
                                  "attention_bias": True}, "c.json")  # fmt: skip
    assert "no bias" in mixed.description and "attention_bias true and mlp_bias false differ" in mixed.description


def test_mixtral_is_a_mixture_of_experts(tmp_path: Path) -> None:
    """Mixtral 8x7B's own config (transformers' MixtralConfig defaults are its sizes): 8 experts, top-2, the zoo's
    mixtral-8x7b."""
    path = _write(tmp_path, transformers.MixtralConfig())
    model = load_model(f"hf:{path}:seq=4096")
    zoo = get_model("mixtral-8x7b")
    assert model.params == zoo.params
    assert [b.shape for layer in model.layers for b in layer.blocks] == [
        b.shape for layer in zoo.layers for b in layer.blocks
    ]


def test_unknown_model_type_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, transformers.BertConfig())
    with pytest.raises(ModelFileError, match=r"model_type 'bert' is not supported; supported: gpt2, llama, mistral, "
                                             r"qwen2, mixtral$"):  # fmt: skip
        load_model(f"hf:{path}")
    config = _raw(path)
    del config["model_type"]
    with pytest.raises(ModelFileError, match="'model_type' is missing"):
        model_from_hf_config(config, "c.json")


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size",
                                 "max_position_embeddings", "num_attention_heads"])  # fmt: skip
def test_a_missing_key_is_named_with_the_file(tmp_path: Path, key: str) -> None:
    config = _raw(_write(tmp_path, transformers.LlamaConfig(**TINY_LLAMA)))
    del config[key]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ModelFileError) as exc:
        load_model(f"hf:{path}")
    assert str(exc.value) == f"{path}: key {key!r} is missing; a model_type llama config needs it"


@pytest.mark.parametrize(("key", "value", "message"), [
    ("num_hidden_layers", "32", "num_hidden_layers must be a positive integer, got '32'"),
    ("hidden_size", 2.5, "hidden_size must be a positive integer, got 2.5"),
    ("vocab_size", 0, "vocab_size must be a positive integer, got 0"),
    ("num_key_value_heads", 3, "num_key_value_heads (3) must divide num_attention_heads (8)"),
    ("head_dim", 64, "head_dim 64 differs from hidden_size / num_attention_heads (32)"),
    ("tie_word_embeddings", "no", "tie_word_embeddings must be true or false, got 'no'"),
    ("dtype", "int8", "dtype 'int8' is not one of bfloat16, float16, float32"),
    ("num_hidden_layers", 10**9, "num_hidden_layers is 1,000,000,000, above the limit"),
])  # fmt: skip
def test_a_bad_value_is_one_line(tmp_path: Path, key: str, value: Any, message: str) -> None:
    config = {"model_type": "llama", **TINY_LLAMA, "max_position_embeddings": 128, key: value}
    with pytest.raises(ModelFileError) as exc:
        model_from_hf_config(config, "c.json")
    assert "\n" not in str(exc.value) and str(exc.value).startswith("c.json: ") and message in str(exc.value)


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ModelFileError, match=rf"^{bad}: malformed JSON at line 1"):
        load_model(f"hf:{tmp_path}")
    bad.write_text("[1, 2]")
    with pytest.raises(ModelFileError, match="a Hugging Face config is a JSON object, got a list"):
        load_model(f"hf:{bad}")
    with pytest.raises(ModelFileError, match="no such file"):
        load_model(f"hf:{tmp_path / 'missing.json'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelFileError, match=r"a directory without a config\.json"):
        load_model(f"hf:{tmp_path / 'empty'}")
    path = _write(tmp_path, transformers.LlamaConfig(**TINY_LLAMA), "llama.json")
    with pytest.raises(ModelFileError, match="takes overrides seq, layers, precision, attention; not 'hidden'"):
        load_model(f"hf:{path}:hidden=8")
    with pytest.raises(ModelFileError, match="precision must be one of"):
        load_model(f"hf:{path}:precision=fp64")
    with pytest.raises(ModelFileError, match=rf"^{path}: attention must be one of flash, unfused"):
        load_model(f"hf:{path}:attention=magic")
    assert not is_model_profile(f"hf:{path}")


def test_split_hf_spec() -> None:
    assert split_hf_spec("hf:a/config.json") == ("a/config.json", {})
    assert split_hf_spec("hf:a/b:seq=8, precision=fp32") == ("a/b", {"seq": "8", "precision": "fp32"})
    assert split_hf_spec("hf:dir:with:colons") == ("dir:with:colons", {})
    with pytest.raises(ModelFileError, match="names no file"):
        split_hf_spec("hf::seq=8")


def test_simulate_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, transformers.LlamaConfig(**TINY_LLAMA))
    args = ["simulate", "--model", f"hf:{path}", "--cluster", "dgx-h100", "--nodes", "1", "--strategy", "1M1P8D"]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    assert "iteration time" in out
    code, out, err = run_cli([*args, "--json"], capsys)
    assert code == 0, err
    assert len(json.loads(out)["per_gpu"]) == 8
    code, out, err = run_cli(["simulate", "--model", f"hf:{tmp_path / 'nope.json'}", "--cluster", "dgx-h100",
                              "--nodes", "1", "--strategy", "1M1P8D"], capsys)  # fmt: skip
    assert code == 2 and "nope.json: no such file" in err and "Traceback" not in err
