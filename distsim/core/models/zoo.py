"""Built-in workloads, each citing the source of its dimensions.

A model is named by a *spec*: a zoo name, optionally with size overrides, e.g. ``gpt2-345m:seq=128,layers=4`` or
``resnet50:image=64,precision=fp32``; a transformer also takes ``attention=flash|unfused|fused_softmax``, the kernel
of its attention cores (default flash). The canonical spec (overrides sorted) becomes the model's name, so profiles
and traces record exactly which model they describe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from distsim.core.errors import ModelFileError, UnknownNameError, suggest
from distsim.core.models.arch import ARCH_KEYS, GPT, LLAMA, Arch, arch_from_items
from distsim.core.models.cnn import inception_v3, resnet50, vgg16, vgg19
from distsim.core.models.graph import PRECISIONS, Model
from distsim.core.models.ops import check_attention_impl
from distsim.core.models.transformer import decoder_only, encoder_decoder

GPT3 = "Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1"
LLAMA3 = (
    "Meta 2024, 'The Llama 3 Herd of Models', Table 3 (layers, model dimension, FFN dimension, heads, 8 key/value "
    "heads, vocabulary 128K: 128,256 tokens in the released tokenizer; 8,192-token pre-training context)"
)
MIXTRAL = ("Jiang et al. 2024, 'Mixtral of Experts', Table 1 (dim 4096, 32 layers, 32 heads, 8 kv heads, hidden 14336, "
           "8 experts, top-2, vocabulary 32000); sequence 4096 (its context is 32768)")  # fmt: skip
MIXTRAL_22B = ("Mistral AI's Mixtral-8x22B-v0.1 release config (hidden 6144, 56 layers, 48 heads, 8 kv heads, "
               "intermediate 16384, 8 experts, top-2, vocabulary 32768); sequence 4096")  # fmt: skip
DEEPSEEK_MOE = ("Dai et al. 2024, 'DeepSeekMoE', Sec. 5.1/Appendix (DeepSeekMoE 16B: 28 layers, hidden 2048, 16 heads, "
                "the first layer dense with FFN 10944, then 64 routed experts of 1408 and 2 shared ones, top-6, "
                "vocabulary 102400); sequence 4096")  # fmt: skip
_DECODER_KEYS = ("layers", "hidden", "heads", "seq", "ffn", "vocab", "precision", "attention", *ARCH_KEYS)
_T5_KEYS = ("layers", "hidden", "heads", "ffn", "seq", "dec_seq", "vocab", "precision", "attention")
_CNN_KEYS = ("image", "classes", "precision")


@dataclass(frozen=True)
class ZooEntry:
    build: Callable[..., Model]
    """Builder taking the overrides in `keys` as keyword arguments."""
    family: str
    keys: tuple[str, ...]
    """Overrides a spec may give, e.g. seq, layers, precision."""
    arch: Arch = GPT
    """A transformer's architecture, which a spec's architecture keys (kv_heads, mlp, ...) change."""


def _decoder(
    name: str, layers: int, h: int, heads: int, seq: int, vocab: int, source: str, causal: bool = True,
    ffn: int | None = None, arch: Arch = GPT, precision: str = "fp16-mixed",
) -> ZooEntry:  # fmt: skip
    """A decoder-only (GPT, causal attention) or encoder-only (BERT, causal=False) stack of `arch`'s layers."""

    def build(**kw: Any) -> Model:
        return decoder_only(
            name, kw.get("layers", layers), kw.get("hidden", h), kw.get("heads", heads), kw.get("seq", seq),
            kw.get("vocab", vocab), source=source, f=kw.get("ffn", ffn),
            precision=kw.get("precision", PRECISIONS[precision]), causal=causal,
            attention=kw.get("attention", "flash"), arch=kw.get("arch", arch),
        )  # fmt: skip

    return ZooEntry(build, "transformer", _DECODER_KEYS, arch)


def _t5(**kw: Any) -> Model:
    layers = kw.get("layers", 12)
    return encoder_decoder(
        "t5-base", layers, layers, kw.get("hidden", 768), kw.get("heads", 12), kw.get("ffn", 3072), kw.get("seq", 512),
        kw.get("dec_seq", 128), kw.get("vocab", 32128),
        source="Raffel et al. 2020, T5-base (d_model 768, d_ff 3072, 12 heads, 12+12 layers); "
        "Megatron-LM T5 sequence lengths 512/128",
        precision=kw.get("precision", PRECISIONS["fp16-mixed"]), attention=kw.get("attention", "flash"),
    )  # fmt: skip


def _cnn(fn: Callable[..., Model], family: str = "cnn") -> ZooEntry:
    def build(**kw: Any) -> Model:
        return fn(**{k: v for k, v in kw.items() if k in _CNN_KEYS})

    return ZooEntry(build, family, _CNN_KEYS)


_ZOO: dict[str, ZooEntry] = {
    "bert-large": _decoder("bert-large", 24, 1024, 16, 512, 30522,
                           "Devlin et al. 2019, BERT-Large (L=24, H=1024, A=16); seq 512 as in DistSim/Megatron-LM",
                           causal=False),
    "bert-exlarge": _decoder("bert-exlarge", 48, 1024, 16, 512, 30522,
                             "DistSim (CF'23) Sec. 6: BERT with 48 transformer layers (DAPPLE's BERT-48, 640M)",
                             causal=False),
    "gpt2-345m": _decoder("gpt2-345m", 24, 1024, 16, 1024, 50257,
                          "Radford et al. 2019 GPT-2 medium; Megatron-LM's 345M config (24 x 1024, 16 heads)"),
    "t5-base": ZooEntry(_t5, "transformer (encoder-decoder)", _T5_KEYS),
    "gpt3-1.3b": _decoder("gpt3-1.3b", 24, 2048, 16, 2048, 50257, GPT3),
    "gpt3-6.7b": _decoder("gpt3-6.7b", 32, 4096, 32, 2048, 50257, GPT3),
    "gpt3-13b": _decoder("gpt3-13b", 40, 5120, 40, 2048, 50257,
                         GPT3 + "; d_model 5120 (the table's 5140 is not divisible by its 40 heads)"),
    "gpt3-175b": _decoder("gpt3-175b", 96, 12288, 96, 2048, 50257, GPT3),
    "transformer": _decoder("transformer", 24, 1024, 16, 1024, 50257,
                            "a decoder-only transformer stated by its sizes and architecture (defaults: GPT-2 "
                            "medium's sizes, GPT's architecture); what --megatron-args builds"),
    "mixtral-8x7b": _decoder("mixtral-8x7b", 32, 4096, 32, 4096, 32000, MIXTRAL + " 8x7B", ffn=14336,
                             arch=replace(LLAMA, kv_heads=8, experts=8, top_k=2), precision="bf16-mixed"),
    "mixtral-8x22b": _decoder("mixtral-8x22b", 56, 6144, 48, 4096, 32768, MIXTRAL_22B, ffn=16384,
                              arch=replace(LLAMA, kv_heads=8, experts=8, top_k=2), precision="bf16-mixed"),
    "deepseek-moe-16b": _decoder("deepseek-moe-16b", 28, 2048, 16, 4096, 102400, DEEPSEEK_MOE, ffn=10944,
                                 arch=replace(LLAMA, experts=64, top_k=6, expert_ffn=1408, shared_ffn=2816,
                                              first_dense=1), precision="bf16-mixed"),
    "llama3-8b": _decoder("llama3-8b", 32, 4096, 32, 8192, 128256, LLAMA3, ffn=14336,
                          arch=replace(LLAMA, kv_heads=8), precision="bf16-mixed"),
    "llama3-70b": _decoder("llama3-70b", 80, 8192, 64, 8192, 128256, LLAMA3, ffn=28672,
                           arch=replace(LLAMA, kv_heads=8), precision="bf16-mixed"),
    "llama3-405b": _decoder("llama3-405b", 126, 16384, 128, 8192, 128256, LLAMA3, ffn=53248,
                            arch=replace(LLAMA, kv_heads=8), precision="bf16-mixed"),
    "vgg16": _cnn(vgg16),
    "vgg19": _cnn(vgg19),
    "resnet50": _cnn(resnet50),
    "inception-v3": _cnn(inception_v3, "cnn (branching)"),
}  # fmt: skip
ZOO = MappingProxyType(_ZOO)

# Zoo models shrunk to train in about a second per iteration on one CPU core (fp32): what the shipped CPU profile
# measures and the executor validation runs. An alias expands to its spec; a spec may add overrides to it.
ALIASES = MappingProxyType({
    "gpt2-cpu": "gpt2-345m:hidden=512,heads=8,layers=4,seq=128,vocab=8192,precision=fp32",
    "bert-cpu": "bert-large:hidden=768,heads=12,layers=4,seq=64,vocab=8192,precision=fp32",
    "t5-cpu": "t5-base:layers=2,seq=64,dec_seq=32,vocab=8192,precision=fp32",
    "llama-cpu": "llama3-8b:hidden=512,heads=8,kv_heads=2,layers=4,seq=128,vocab=8192,ffn=1376,precision=fp32",
    "moe-cpu": "mixtral-8x7b:hidden=512,heads=8,kv_heads=2,layers=4,seq=128,vocab=8192,ffn=688,experts=4,"
    "precision=fp32",
})  # fmt: skip


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """'name:key=value,key=value' -> (name, {key: value})."""
    name, _, rest = spec.partition(":")
    overrides: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ModelFileError(f"cannot read {item!r} in model spec {spec!r}; write name:key=value,key=value")
        overrides[key.strip()] = value.strip()
    return name.strip().lower(), overrides


def get_model(spec: str) -> Model:
    """A zoo model by name, with optional size overrides (``gpt2-345m:seq=128,layers=4,precision=fp32``) and, for a
    transformer, its attention kernel (``gpt2-345m:attention=unfused``)."""
    name, raw = parse_spec(spec)
    alias = None
    if name in ALIASES:
        alias = name
        name, base = parse_spec(ALIASES[name])
        raw = {**base, **raw}
    entry = ZOO.get(name)
    if entry is None:
        raise UnknownNameError(f"unknown model {name!r}{suggest(name, [*ZOO, *ALIASES])}")
    kw: dict[str, Any] = {}
    arch_items = {k: v for k, v in raw.items() if k in ARCH_KEYS and k in entry.keys}
    if arch_items:
        kw["arch"] = arch_from_items(entry.arch, arch_items, f"model {name}")
    for key, value in raw.items():
        if key not in entry.keys:
            raise ModelFileError(f"model {name} takes overrides {', '.join(entry.keys)}; not {key!r}")
        if key in arch_items:
            continue
        if key == "precision":
            if value not in PRECISIONS:
                raise ModelFileError(f"precision must be one of {', '.join(PRECISIONS)}, got {value!r}")
            kw[key] = PRECISIONS[value]
        elif key == "attention":
            kw[key] = check_attention_impl(value, f"model {name}")
        else:
            try:
                kw[key] = int(value)
            except ValueError:
                raise ModelFileError(f"model override {key} must be an integer, got {value!r}") from None
            if kw[key] < 1:
                raise ModelFileError(f"model override {key} must be >= 1, got {value}")
    model = entry.build(**kw)
    if alias is not None:
        extra = parse_spec(spec)[1]
        name = alias + (":" + ",".join(f"{k}={extra[k]}" for k in sorted(extra)) if extra else "")
        return model.with_layers(model.layers, name=name, description=f"{model.description} ({ALIASES[alias]})")
    if raw:
        canonical = name + ":" + ",".join(f"{k}={raw[k]}" for k in sorted(raw))
        model = model.with_layers(model.layers, name=canonical)
    return model
