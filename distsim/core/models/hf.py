"""A Hugging Face ``config.json`` (already parsed) -> Model: ``--model hf:PATH`` builds the model from its shapes.

Supported ``model_type`` values and what each becomes (:mod:`distsim.core.models.arch`):

* ``gpt2``: n_layer, n_embd, n_head, n_positions, vocab_size, n_inner (null: 4 n_embd), tie_word_embeddings
  (default true); GPT's architecture (GeLU MLP, layer norm, learned positions, biases, dropout).
* ``llama``, ``mistral``: num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads (null or absent:
  as many as the heads), intermediate_size, vocab_size, max_position_embeddings, tie_word_embeddings (default true,
  as Hugging Face's), attention_bias and mlp_bias (default false); Llama's architecture (SwiGLU, RMSNorm, rope, no
  dropout). Mistral's sliding-window attention is modelled as full causal attention (exact when seq <= the window).
* ``qwen2``: as llama, but Qwen2's Q, K and V projections have biases and its other linear layers do not; distsim's
  architecture has one bias flag for all of them, so the model has none (the description says how many parameters
  that leaves out).

* ``mixtral``: as mistral, its MLP a mixture of num_local_experts experts of intermediate_size, each token routed to
  num_experts_per_tok of them (:mod:`distsim.core.models.moe`).

Any other model_type is refused in one line. rms_norm_eps, rope_theta and
the like change no shape and are not read.

Sequence length: the ``seq`` override, else min(max_position_embeddings (n_positions for GPT-2), 4096). Precision:
the ``precision`` override, else the config's ``torch_dtype`` (``dtype`` since transformers 5): bfloat16 ->
bf16-mixed, float16 -> fp16-mixed, float32 -> fp32; absent -> bf16-mixed. Other overrides: ``layers`` (fewer or
more layers of the same shape) and ``attention`` (the attention kernel: flash, unfused, fused_softmax).

A spec writes the overrides after the path as a zoo spec does: ``hf:models/llama/config.json:seq=2048,layers=4``
(:func:`split_hf_spec`). The model's name is ``hf:<model_type>:<the config's _name_or_path, else the directory
holding config.json>`` plus the overrides, e.g. ``hf:llama:Meta-Llama-3-8B:seq=2048``. Pure values, no I/O: the file
is read by :func:`distsim.io.files.load_model`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import PurePath
from typing import Any

from distsim.core.checks import integer
from distsim.core.errors import ModelFileError
from distsim.core.models.arch import GPT, LLAMA, Arch
from distsim.core.models.graph import MAX_LAYERS, PRECISIONS, Model
from distsim.core.models.ops import check_attention_impl
from distsim.core.models.transformer import check_dims, decoder_only

PREFIX = "hf:"
"""What starts a --model spec naming a Hugging Face config."""
SUPPORTED = ("gpt2", "llama", "mistral", "qwen2", "mixtral")
"""model_type values that :func:`model_from_hf_config` builds."""
OVERRIDES = ("seq", "layers", "precision", "attention")
"""Keys a ``hf:PATH:key=value,...`` spec may give."""
DEFAULT_MAX_SEQ = 4096
"""The default sequence length is the config's context length, capped at this."""
DTYPES = {"bfloat16": "bf16-mixed", "float16": "fp16-mixed", "float32": "fp32"}
"""A config's torch_dtype -> distsim's precision."""
DEFAULT_PRECISION = "bf16-mixed"
_MISSING = object()


def split_hf_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``hf:PATH`` or ``hf:PATH:key=value,key=value`` -> (PATH, {key: value}). The overrides are what follows the
    last colon when every comma-separated item there is key=value; otherwise the whole rest is the path."""
    rest = spec[len(PREFIX) :] if spec.startswith(PREFIX) else spec
    path, sep, tail = rest.rpartition(":")
    items = [x.strip() for x in tail.split(",") if x.strip()]
    if not sep or not items or not all("=" in x for x in items):
        path, items = rest, []
    overrides: dict[str, str] = {}
    for item in items:
        key, _, value = item.partition("=")
        if not key.strip() or not value.strip():
            raise ModelFileError(f"cannot read {item!r} in model spec {spec!r}; write hf:PATH:key=value,key=value")
        overrides[key.strip()] = value.strip()
    if not path.strip():
        raise ModelFileError(f"model spec {spec!r} names no file; write hf:PATH (a config.json or its directory)")
    return path.strip(), overrides


def _get(config: Mapping[str, Any], key: str, where: str, family: str, default: Any = _MISSING) -> Any:
    if key in config and config[key] is not None:
        return config[key]
    if default is _MISSING:
        state = "null" if key in config else "missing"
        raise ModelFileError(f"{where}: key {key!r} is {state}; a {family} config needs it")
    return default


def _count(config: Mapping[str, Any], key: str, where: str, family: str, default: Any = _MISSING) -> int:
    value = _get(config, key, where, family, default)
    if isinstance(value, str):  # a JSON number written as a string is a malformed config, not a count
        raise ModelFileError(f"{where}: {key} must be a positive integer, got {value!r}")
    return integer(value, f"{where}: {key}", ModelFileError, 1, MAX_LAYERS if key in ("num_hidden_layers", "n_layer")
                   else None)  # fmt: skip


def _bool(config: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ModelFileError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _name(config: Mapping[str, Any], where: str) -> str:
    """The config's _name_or_path (a local path's last part), else the directory holding the file."""
    raw = config.get("_name_or_path")
    if raw is not None and not isinstance(raw, str):
        raise ModelFileError(f"{where}: _name_or_path must be a string, got {raw!r}")
    text = (raw or "").strip().rstrip("/")
    if text:
        return PurePath(text).name if text.startswith(("/", ".", "~")) else text
    p = PurePath(where)
    if p.name == "config.json":
        return p.parent.name or "config"
    return p.stem or p.name


def _precision(config: Mapping[str, Any], where: str, override: str | None) -> str:
    if override is not None:
        if override not in PRECISIONS:
            raise ModelFileError(f"precision must be one of {', '.join(PRECISIONS)}, got {override!r}")
        return override
    key = "dtype" if config.get("dtype") is not None else "torch_dtype"
    value = config.get(key)
    if value is None:
        return DEFAULT_PRECISION
    if value not in DTYPES:
        raise ModelFileError(f"{where}: {key} {value!r} is not one of {', '.join(DTYPES)}; give precision= "
                             f"({', '.join(PRECISIONS)}) in the spec")  # fmt: skip
    return DTYPES[value]


def _whole_override(overrides: Mapping[str, str], key: str, maximum: int | None = None) -> int | None:
    if key not in overrides:
        return None
    value = overrides[key]
    if not str(value).strip().isdigit():
        raise ModelFileError(f"model override {key} must be a positive integer, got {value!r}")
    return integer(int(value), f"model override {key}", ModelFileError, 1, maximum)


def model_from_hf_config(config: Mapping[str, Any], where: str, overrides: Mapping[str, str] | None = None) -> Model:
    """The model a Hugging Face config describes (see the module's docstring); `where` names the file in errors and
    in the model's name and source; `overrides` (seq, layers, precision, attention) as a spec writes them."""
    overrides = dict(overrides or {})
    if not isinstance(config, Mapping):
        raise ModelFileError(f"{where}: a Hugging Face config is a JSON object, got {type(config).__name__}")
    unknown = sorted(set(overrides) - set(OVERRIDES))
    if unknown:
        raise ModelFileError(f"an hf: model takes overrides {', '.join(OVERRIDES)}; not {unknown[0]!r}")
    model_type = config.get("model_type")
    if model_type is None:
        raise ModelFileError(f"{where}: key 'model_type' is missing; supported: {', '.join(SUPPORTED)}")
    if model_type not in SUPPORTED:
        raise ModelFileError(f"{where}: model_type {model_type!r} is not supported; supported: "
                             f"{', '.join(SUPPORTED)}")  # fmt: skip
    family = f"model_type {model_type}"
    notes: list[str] = []
    if model_type == "gpt2":
        layers = _count(config, "n_layer", where, family)
        hidden = _count(config, "n_embd", where, family)
        heads = _count(config, "n_head", where, family)
        context = _count(config, "n_positions", where, family)
        vocab = _count(config, "vocab_size", where, family)
        ffn = _count(config, "n_inner", where, family, 4 * hidden)
        arch = replace(GPT, tied_embeddings=_bool(config, "tie_word_embeddings", where, True))
        context_key = "n_positions"
    else:
        layers, hidden, heads, ffn, vocab, context, arch = _llama_family(config, where, family, model_type, notes)
        context_key = "max_position_embeddings"
    seq = _whole_override(overrides, "seq")
    seq = seq if seq is not None else min(context, DEFAULT_MAX_SEQ)
    if arch.position == "learned" and seq > context:
        raise ModelFileError(f"{where}: seq {seq} is longer than the learned position table ({context_key} "
                             f"{context})")  # fmt: skip
    if model_type != "gpt2":
        window = config.get("sliding_window")
        sliding = model_type == "mistral" or bool(config.get("use_sliding_window"))
        if sliding and window is not None:
            window = _count(config, "sliding_window", where, family)
            if seq > window:
                notes.append(f"sliding-window attention (window {window}) is modelled as full causal attention "
                             f"over seq {seq}")  # fmt: skip
    layers = _whole_override(overrides, "layers", MAX_LAYERS) or layers
    precision = _precision(config, where, overrides.get("precision"))
    attention = check_attention_impl(overrides.get("attention", "flash"), where)
    check_dims({"layers": layers, "hidden": hidden, "heads": heads, "seq": seq, "vocab": vocab, "ffn": ffn}, where)
    name = f"{PREFIX}{model_type}:{_name(config, where)}"
    if overrides:
        name += ":" + ",".join(f"{k}={overrides[k]}" for k in sorted(overrides))
    approx = f"; approximated: {'; '.join(notes)}" if notes else ""
    source = f"Hugging Face config {where} (model_type {model_type}){approx}"
    model = decoder_only(name, layers, hidden, heads, seq, vocab, source=source, f=ffn,
                         precision=PRECISIONS[precision], attention=attention, arch=arch)  # fmt: skip
    return model.with_layers(model.layers, name=name, description=f"{model.description} (from {where}){approx}")


def _llama_family(config: Mapping[str, Any], where: str, family: str, model_type: str,
                  notes: list[str]) -> tuple[int, int, int, int, int, int, Arch]:  # fmt: skip
    """(layers, hidden, heads, ffn, vocab, context, architecture) of a llama, mistral, qwen2 or mixtral config;
    what is approximated goes into `notes`."""
    layers = _count(config, "num_hidden_layers", where, family)
    hidden = _count(config, "hidden_size", where, family)
    heads = _count(config, "num_attention_heads", where, family)
    kv = _count(config, "num_key_value_heads", where, family, heads)
    ffn = _count(config, "intermediate_size", where, family)
    vocab = _count(config, "vocab_size", where, family)
    context = _count(config, "max_position_embeddings", where, family)
    if hidden % heads:
        raise ModelFileError(f"{where}: hidden_size ({hidden}) must be divisible by num_attention_heads ({heads})")
    head_dim = _count(config, "head_dim", where, family, hidden // heads)
    if head_dim != hidden // heads:
        raise ModelFileError(f"{where}: head_dim {head_dim} differs from hidden_size / num_attention_heads "
                             f"({hidden // heads}); distsim gives each head hidden/heads dimensions")  # fmt: skip
    if heads % kv:
        raise ModelFileError(f"{where}: num_key_value_heads ({kv}) must divide num_attention_heads ({heads})")
    bias = _bool(config, "attention_bias", where, False)
    mlp_bias = _bool(config, "mlp_bias", where, False)
    d = hidden // heads
    if model_type == "qwen2":
        notes.append(f"Qwen2's Q/K/V projection biases ({(heads + 2 * kv) * d:,} parameters per layer) are left "
                     "out: distsim has one bias flag for all linear layers and the others have none")  # fmt: skip
        bias = False
    elif bias != mlp_bias:
        notes.append(f"attention_bias {str(bias).lower()} and mlp_bias {str(mlp_bias).lower()} differ; distsim "
                     "has one bias flag for all linear layers, so none has biases")  # fmt: skip
        bias = False
    arch = replace(LLAMA, kv_heads=kv if kv != heads else None, bias=bias,
                   tied_embeddings=_bool(config, "tie_word_embeddings", where, True))  # fmt: skip
    if model_type == "mixtral":  # num_local_experts experts of intermediate_size each, top num_experts_per_tok
        experts = _count(config, "num_local_experts", where, family)
        arch = replace(arch, experts=experts, top_k=_count(config, "num_experts_per_tok", where, family))
    return layers, hidden, heads, ffn, vocab, context, arch
