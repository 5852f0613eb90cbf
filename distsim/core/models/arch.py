"""What distinguishes one transformer family's layer from Megatron's GPT: an :class:`Arch` value.

GPT-2/3 and BERT (the defaults): multi-head attention, a GeLU MLP, layer norm, learned positions, the LM head tied to
the word embedding, biases on every linear layer, dropout. Llama-style models (Llama 2/3, Mistral, Mixtral, Qwen2):
grouped-query attention (``kv_heads`` key/value heads shared by groups of query heads; one is multi-query
attention), a SwiGLU MLP (three weight matrices: gate and up, h -> ffn each, and down, ffn -> h; Megatron fuses gate
and up into one column-parallel GEMM of 2 ffn outputs), RMSNorm (a scale, no bias), rotary position embeddings
applied to Q and K (no position table), an untied output layer, no biases, no dropout (Touvron et al. 2023, "Llama
2", Sec. 2.2; Meta, "The Llama 3 Herd of Models", 2024, Table 3; Megatron-LM's ``--swiglu
--normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights
--disable-bias-linear --group-query-attention``).

Every choice changes the layer's kernels (time and host cost), its parameters, its FLOPs and its kept activations
together: :mod:`distsim.core.models.transformer` builds the blocks from an :class:`Arch`. Pure values, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from distsim.core.errors import ModelFileError

MLPS = ("gelu", "swiglu")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope")
CHOICES: Mapping[str, tuple[str, ...]] = {"mlp": MLPS, "norm": NORMS, "position": POSITIONS}
"""The named choices of an architecture, key -> its values."""
FLAGS = ("tied_embeddings", "bias", "dropout")
"""The on/off choices (a spec writes them 0 or 1)."""


@dataclass(frozen=True)
class Arch:
    """A transformer layer's architecture beyond its sizes."""

    kv_heads: int | None = None
    """Key/value heads (grouped-query attention; 1: multi-query); None: as many as query heads (multi-head)."""
    mlp: str = "gelu"
    """``gelu`` (two GEMMs around a GeLU, ffn = 4h by default) or ``swiglu`` (gate and up, then down; ffn given)."""
    norm: str = "layernorm"
    """``layernorm`` (scale and bias) or ``rmsnorm`` (scale only)."""
    position: str = "learned"
    """``learned`` (a position table in the embedding) or ``rope`` (rotary embeddings applied to Q and K)."""
    tied_embeddings: bool = True
    """The LM head's projection shares the word embedding's weights (GPT-2/3); False: its own (Llama)."""
    bias: bool = True
    """Linear layers have biases (GPT); False: none (Llama, Megatron's --disable-bias-linear)."""
    dropout: bool = True
    """Hidden and attention dropout (their masks are kept for backward); False: none (Llama's pre-training)."""
    experts: int = 0
    """Routed experts of a mixture-of-experts MLP (Mixtral: 8); 0: a dense MLP."""
    top_k: int = 2
    """Experts each token is routed to (Mixtral: 2)."""
    expert_ffn: int = 0
    """Hidden size of one expert's MLP (Megatron's --moe-ffn-hidden-size); 0: the model's ffn."""
    shared_ffn: int = 0
    """Hidden size of the shared experts every token also runs (DeepSeek-MoE; Megatron's
    --moe-shared-expert-intermediate-size); 0: none."""
    first_dense: int = 0
    """Layers at the start whose MLP is dense (of the model's ffn) rather than experts (DeepSeek-MoE: 1)."""
    moe_load: float = 1.0
    """Under expert parallelism, the routed tokens the most loaded rank's experts receive over the mean: 1 is a
    balanced router; Megatron's --moe-expert-capacity-factor caps it (tokens beyond are dropped). The slowest rank
    sets the pace of the combine all-to-all, so the experts' compute and the exchanges take this many times as
    long. (With every expert on every GPU the grouped GEMMs run all routed tokens whatever the balance.)"""

    def __post_init__(self) -> None:
        for key, allowed in CHOICES.items():
            value = getattr(self, key)
            if value not in allowed:
                raise ModelFileError(f"{key} must be one of {', '.join(allowed)}, got {value!r}")
        for key in FLAGS:
            if not isinstance(getattr(self, key), bool):
                raise ModelFileError(f"{key} must be true or false (1 or 0), got {getattr(self, key)!r}")
        if self.kv_heads is not None and (isinstance(self.kv_heads, bool) or not isinstance(self.kv_heads, int)
                                          or self.kv_heads < 1):  # fmt: skip
            raise ModelFileError(f"kv_heads must be a whole number >= 1, got {self.kv_heads!r}")
        for key, low in (("experts", 0), ("top_k", 1), ("expert_ffn", 0), ("shared_ffn", 0), ("first_dense", 0)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ModelFileError(f"{key} must be a whole number >= {low}, got {value!r}")
        load = self.moe_load
        if isinstance(load, bool) or not isinstance(load, int | float) or not 0.1 <= load <= 100:
            raise ModelFileError(f"moe_load must be a number in [0.1, 100], got {load!r}")
        if self.experts and self.top_k > self.experts:
            raise ModelFileError(f"top_k ({self.top_k}) cannot exceed experts ({self.experts})")

    def groups(self, heads: int) -> int:
        """Key/value heads for `heads` query heads (checked: they must divide them)."""
        kv = heads if self.kv_heads is None else self.kv_heads
        if heads % kv:
            raise ModelFileError(f"kv_heads ({kv}) must divide heads ({heads}): each key/value head serves a group "
                                 "of query heads")  # fmt: skip
        return kv

    @property
    def norm_params(self) -> int:
        """Parameters of a norm per hidden unit: scale and bias (layer norm) or scale (RMSNorm)."""
        return 2 if self.norm == "layernorm" else 1

    def describe(self) -> str:
        """What differs from GPT, e.g. ``GQA 8 kv heads, swiglu, rmsnorm, rope, untied, no bias, no dropout``."""
        parts = [] if self.kv_heads is None else [f"GQA {self.kv_heads} kv heads"]
        if self.experts:
            parts.append(f"MoE {self.experts} experts top-{self.top_k}"
                         + (f", expert ffn {self.expert_ffn}" if self.expert_ffn else "")
                         + (f", shared ffn {self.shared_ffn}" if self.shared_ffn else "")
                         + (f", load {self.moe_load:g}" if self.moe_load != 1 else "")
                         + (f", first {self.first_dense} dense" if self.first_dense else ""))  # fmt: skip
        parts += [getattr(self, k) for k, v in CHOICES.items() if getattr(self, k) != v[0]]
        parts += [f"no {k.replace('_', ' ')}" if k != "tied_embeddings" else "untied" for k in FLAGS
                  if not getattr(self, k)]  # fmt: skip
        return ", ".join(parts)


GPT = Arch()
LLAMA = Arch(mlp="swiglu", norm="rmsnorm", position="rope", tied_embeddings=False, bias=False, dropout=False)
"""Llama 2/3, Mistral and Mixtral's dense parts (set kv_heads for grouped-query attention)."""
COUNTS = ("kv_heads", "experts", "top_k", "expert_ffn", "shared_ffn", "first_dense")
"""Whole-number keys of an architecture."""
ARCH_KEYS = (*COUNTS, *CHOICES, *FLAGS, "moe_load")
"""Keys of an architecture in a model spec or a model file's ``transformer`` mapping."""


def arch_from_items(base: Arch, items: Mapping[str, Any], where: str) -> Arch:
    """`base` with the architecture keys among `items` (strings as a spec writes them, or a file's values)."""
    changes: dict[str, Any] = {}
    for key, value in items.items():
        if key not in ARCH_KEYS:
            continue
        if key in COUNTS:
            changes[key] = _whole(value, f"{where}: {key}")
        elif key == "moe_load":
            changes[key] = _number(value, f"{where}: {key}")
        elif key in FLAGS:
            changes[key] = _flag(value, f"{where}: {key}")
        else:
            changes[key] = str(value).lower()
    try:
        return replace(base, **changes)
    except ModelFileError as exc:
        raise ModelFileError(f"{where}: {exc}") from None


def _whole(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).strip().isdigit():
        raise ModelFileError(f"{where} must be a whole number, got {value!r}")
    return int(value)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise ModelFileError(f"{where} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ModelFileError(f"{where} must be a number, got {value!r}") from None


def _flag(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    raise ModelFileError(f"{where} must be 0 or 1 (true or false), got {value!r}")
