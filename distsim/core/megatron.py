"""Megatron-LM's ``pretrain_gpt.py`` arguments as a distsim job: the model (a ``transformer:`` spec), the strategy and
the framework's overlap options, with every flag accounted for.

A launch line is read flag by flag (``--flag value`` or ``--flag=value``; a flag without a value is a switch). Each
flag is one of: *used* (it sets the model, the parallel layout, the batch, recomputation, the optimizer sharding,
precision or an overlap option); *no effect on the iteration's time* (learning rate, data paths, logging,
checkpointing, and torchrun's own flags, since the cluster comes from ``--cluster`` and ``--nodes``:
:data:`NO_EFFECT`), listed as such; *not modelled*,
refused in one line; or *unknown*, listed so that nothing is dropped silently. Defaults are Megatron-LM's
(``megatron/training/arguments.py``): dropout 0.1, learned absolute positions, LayerNorm, GeLU with ffn = 4h, tied
embeddings, biases. The vocabulary is padded as distsim pads it (to a multiple of 128; Megatron pads to 128 x tp,
a difference of at most 128 x tp rows).

Pure: no I/O (the CLI reads a file of arguments and resolves the cluster).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from distsim.core.errors import DistsimError


class MegatronArgsError(DistsimError, ValueError):
    """Megatron arguments that cannot be turned into a job."""


VALUED = {
    "num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "num-query-groups", "seq-length",
    "max-position-embeddings", "position-embedding-type", "normalization", "micro-batch-size", "global-batch-size",
    "tensor-model-parallel-size", "pipeline-model-parallel-size", "context-parallel-size",
    "expert-model-parallel-size", "num-layers-per-virtual-pipeline-stage", "num-virtual-stages-per-pipeline-rank",
    "recompute-granularity", "recompute-method", "recompute-num-layers", "vocab-size", "padded-vocab-size",
    "make-vocab-size-divisible-by", "tokenizer-type", "tokenizer-model", "attention-dropout", "hidden-dropout",
    "fp8-format", "num-experts", "moe-router-topk", "moe-ffn-hidden-size", "moe-shared-expert-intermediate-size",
    "moe-expert-capacity-factor", "moe-token-dispatcher-type",
    "attention-backend", "rotary-base",
    "rotary-percent", "kv-channels", "norm-epsilon", "vocab-file", "merge-file",
}  # fmt: skip
"""Flags this reader understands that take a value."""
SWITCHES = {
    "group-query-attention", "swiglu", "untie-embeddings-and-output-weights", "disable-bias-linear",
    "sequence-parallel", "use-distributed-optimizer", "overlap-grad-reduce", "overlap-param-gather", "tp-comm-overlap",
    "bf16", "fp16", "use-flash-attn", "use-mcore-models", "no-masked-softmax-fusion", "use-rotary-position-embeddings",
    "moe-grouped-gemm",
}  # fmt: skip
"""Flags this reader understands that take no value."""
NO_EFFECT = {
    "lr", "min-lr", "lr-decay-style", "lr-warmup-iters", "lr-warmup-fraction", "lr-decay-iters", "lr-warmup-samples",
    "lr-decay-samples", "weight-decay", "clip-grad", "adam-beta1", "adam-beta2", "adam-eps", "init-method-std",
    "train-iters", "train-samples", "eval-iters", "eval-interval", "log-interval", "save-interval", "save", "load",
    "data-path", "split", "seed", "tensorboard-dir", "wandb-project", "wandb-exp-name", "log-throughput",
    "log-timers-to-tensorboard", "distributed-backend", "distributed-timeout-minutes", "exit-duration-in-mins",
    "data-cache-path", "dataloader-type", "num-workers", "ckpt-format", "transformer-impl", "rotary-base",
    "rotary-percent", "norm-epsilon", "vocab-file", "merge-file", "tokenizer-type", "max-position-embeddings",
    "use-mcore-models", "use-flash-attn", "attention-backend", "no-masked-softmax-fusion", "kv-channels",
    "bias-swiglu-fusion", "no-bias-swiglu-fusion", "bias-gelu-fusion", "no-bias-gelu-fusion", "bias-dropout-fusion",
    "no-bias-dropout-fusion", "apply-layernorm-1p", "use-rotary-position-embeddings", "no-position-embedding",
    "attention-softmax-in-fp32", "accumulate-allreduce-grads-in-fp32", "fp8-amax-history-len",
    "fp8-amax-compute-algo", "fp8-margin", "initial-loss-scale", "loss-scale-window", "hysteresis", "min-loss-scale",
    "no-load-optim", "no-load-rng", "no-save-optim", "no-save-rng", "eval-only", "mock-data", "manual-gc",
    "manual-gc-interval", "calculate-per-token-loss", "cross-entropy-loss-fusion", "no-gradient-accumulation-fusion",
    "defer-embedding-wgrad-compute", "use-torch-fsdp2", "log-params-norm", "log-num-zeros-in-grad",
    "moe-grouped-gemm", "moe-router-load-balancing-type", "moe-aux-loss-coeff", "moe-z-loss-coeff",
    "moe-router-dtype", "moe-router-pre-softmax", "moe-permute-fusion", "moe-input-jitter-eps",
    "nnodes", "nproc-per-node", "nproc_per_node", "node-rank", "node_rank", "master-addr", "master_addr",
    "master-port", "master_port", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "standalone",
}  # fmt: skip
"""Flags with no effect on one iteration's time or memory as distsim models it (optimiser hyper-parameters, data,
logging, checkpoints; fusions and attention backends, which the framework preset states)."""
NOT_MODELLED: dict[str, int] = {}
"""Flags whose values other than these distsim cannot simulate yet."""
TOKENIZER_VOCAB = (("llama-3", 128256), ("llama3", 128256), ("llama-2", 32000), ("mistral", 32000), ("gpt2", 50257))
"""Vocabulary of the tokenizers a launch line names by ``--tokenizer-model``/``--tokenizer-type`` (released
tokenizers' sizes); any other needs ``--vocab-size``."""


@dataclass(frozen=True)
class MegatronJob:
    """What a launch line says, in distsim's terms."""

    spec: str
    """The model, as a ``transformer:`` spec."""
    tp: int
    pp: int
    micro_batch_size: int
    global_batch_size: int | None
    strategy: dict[str, Any]
    """Strategy fields besides the degrees and the batch (schedule, virtual_stages, recompute, sequence_parallel,
    optimizer_sharding)."""
    framework: dict[str, bool]
    """Framework overlap fields the launch line switched on (tp_comm_overlap, overlap_grad_reduce,
    overlap_param_gather)."""
    used: tuple[str, ...] = ()
    no_effect: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def degrees(self, gpus: int) -> tuple[int, int, int, int]:
        """(tp, pp, dp, micro-batches) on `gpus` GPUs (dp = gpus / (tp pp), as torchrun's world size gives it; the
        micro-batches from --global-batch-size, else 1 per data-parallel rank)."""
        if gpus % (self.tp * self.pp):
            raise MegatronArgsError(f"{gpus} GPUs do not divide into tensor-parallel {self.tp} x pipeline-parallel "
                                    f"{self.pp}; give --nodes so that they do")  # fmt: skip
        dp = gpus // (self.tp * self.pp)
        cp = self.strategy.get("cp", 1)
        if dp % cp:
            raise MegatronArgsError(f"{gpus} GPUs over tp {self.tp} x pp {self.pp} leave {dp} replicas, which "
                                    f"--context-parallel-size {cp} does not divide")  # fmt: skip
        if self.global_batch_size is None:
            return self.tp, self.pp, dp, 1
        per = dp // cp * self.micro_batch_size  # a context-parallel group shares its samples
        if self.global_batch_size % per:
            raise MegatronArgsError(f"--global-batch-size {self.global_batch_size} is not a multiple of data-parallel "
                                    f"{dp // cp} x --micro-batch-size {self.micro_batch_size}")  # fmt: skip
        return self.tp, self.pp, dp, self.global_batch_size // per


def tokenize(text: str | Sequence[str]) -> list[str]:
    """A launch line (shell words; ``\\`` line continuations and ``#`` comments allowed) or its words."""
    if isinstance(text, str):
        return shlex.split(text.replace("\\\n", " "), comments=True)
    return list(text)


def read_flags(words: Sequence[str]) -> tuple[dict[str, str | None], list[str]]:
    """{flag: value or None} of the ``--`` words (the last occurrence wins) and the words that are not flags
    (a script name, its interpreter)."""
    flags: dict[str, str | None] = {}
    loose: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            loose.append(word)
            i += 1
            continue
        name, eq, value = word[2:].partition("=")
        if eq:
            flags[name] = value
        elif name not in SWITCHES and i + 1 < len(words) and not words[i + 1].startswith("--"):
            flags[name] = words[i + 1]
            i += 1
        else:
            flags[name] = None
        i += 1
    return flags, loose


def parse_megatron_args(text: str | Sequence[str]) -> MegatronJob:
    """The job a Megatron-LM launch line describes (see the module docstring); one-line errors name the flag."""
    flags, _loose = read_flags(tokenize(text))
    get = _Getter(flags)
    for name, plain in NOT_MODELLED.items():
        value = get.integer(name, plain, minimum=0)
        if value != plain:
            raise MegatronArgsError(f"--{name} {value}: not modelled yet (distsim simulates tensor, pipeline, data "
                                    "and expert parallelism; context parallelism is coming)")  # fmt: skip
    layers, h, heads = get.integer("num-layers"), get.integer("hidden-size"), get.integer("num-attention-heads")
    tp = get.integer("tensor-model-parallel-size", 1)
    spec: dict[str, Any] = {"layers": layers, "hidden": h, "heads": heads, "seq": get.integer("seq-length"),
                            "vocab": _vocab(get), "ffn": get.integer("ffn-hidden-size", 4 * h)}  # fmt: skip
    if get.switch("group-query-attention") or "num-query-groups" in flags:
        spec["kv_heads"] = get.integer("num-query-groups", heads)
    if get.integer("kv-channels", h // heads) != h // heads:
        raise MegatronArgsError(f"--kv-channels {flags['kv-channels']}: heads of other than hidden/heads = "
                                f"{h // heads} dimensions are not modelled")  # fmt: skip
    spec["mlp"] = "swiglu" if get.switch("swiglu") else "gelu"
    experts = get.integer("num-experts", 0, minimum=0)
    if experts:  # a mixture of experts, every expert on every GPU (expert parallelism 1)
        spec["experts"], spec["top_k"] = experts, get.integer("moe-router-topk", 2)
        spec["expert_ffn"] = get.integer("moe-ffn-hidden-size", spec["ffn"])
        spec["shared_ffn"] = get.integer("moe-shared-expert-intermediate-size", 0, minimum=0)
        if "moe-expert-capacity-factor" in flags:  # tokens beyond capacity are dropped: the load is capped there
            spec["moe_load"] = get.number("moe-expert-capacity-factor", 1.0)
        dispatchers = {"alltoall": "alltoall", "allgather": "allgather", "alltoall_seq": "alltoall", "flex": "alltoall"}
        dispatcher = get.choice("moe-token-dispatcher-type", dispatchers, None)
        if dispatcher == "allgather":
            get.notes.append("--moe-token-dispatcher-type allgather: modelled as the all-to-all dispatcher")
    spec["norm"] = get.choice("normalization", {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}, "LayerNorm")
    rope = get.switch("use-rotary-position-embeddings")
    spec["position"] = "rope" if rope else get.choice(
        "position-embedding-type", {"learned_absolute": "learned", "rope": "rope"}, "learned_absolute"
    )  # fmt: skip
    spec["tied_embeddings"] = int(not get.switch("untie-embeddings-and-output-weights"))
    spec["bias"] = int(not get.switch("disable-bias-linear"))
    spec["dropout"] = int(get.number("attention-dropout", 0.1) > 0 or get.number("hidden-dropout", 0.1) > 0)
    spec["precision"] = _precision(get)
    strategy = _strategy(get, layers, get.integer("pipeline-model-parallel-size", 1))
    framework = {name.replace("-", "_"): True for name in ("tp-comm-overlap", "overlap-grad-reduce",
                                                           "overlap-param-gather") if get.switch(name)}  # fmt: skip
    pp, mbs = get.integer("pipeline-model-parallel-size", 1), get.integer("micro-batch-size", 1)
    gbs = get.integer("global-batch-size", None)
    used = tuple(sorted(get.used))
    no_effect = tuple(sorted(f for f in flags if f in NO_EFFECT and f not in get.used))
    unknown = tuple(sorted(f for f in flags if f not in get.used and f not in NO_EFFECT))
    text_spec = "transformer:" + ",".join(f"{k}={v}" for k, v in sorted(spec.items()))
    return MegatronJob(text_spec, tp, pp, mbs, gbs, strategy, framework, used, no_effect, unknown, tuple(get.notes))


def _strategy(get: _Getter, layers: int, pp: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    per_virtual = get.integer("num-layers-per-virtual-pipeline-stage", None)
    virtual = get.integer("num-virtual-stages-per-pipeline-rank", None)
    if per_virtual is not None:
        if layers % (pp * per_virtual):
            raise MegatronArgsError(f"--num-layers-per-virtual-pipeline-stage {per_virtual} does not divide "
                                    f"{layers} layers over {pp} pipeline ranks")  # fmt: skip
        virtual = layers // (pp * per_virtual)
    if virtual is not None and virtual > 1:
        out["schedule"], out["virtual_stages"] = "interleaved", virtual
    stages = pp * (virtual or 1)
    if stages > 1 and layers % stages == 0:  # Megatron's split: equal layers, the embedding first, the head last
        each = layers // stages
        out["partition"] = (each + 1, *([each] * (stages - 2)), each + 1)
    granularity = get.choice("recompute-granularity", {"full": "full", "selective": "selective"}, None)
    if granularity is not None:
        out["recompute"] = granularity
        method = get.choice("recompute-method", {"uniform": "uniform", "block": "block"}, None)
        count = get.integer("recompute-num-layers", None)
        if granularity == "full" and method == "block" and count is not None:
            out["recompute_layers"] = count  # the first N layers of each stage (Megatron's block method)
        elif granularity == "full" and method == "uniform" and count not in (None, 1):
            get.notes.append(
                f"--recompute-method uniform --recompute-num-layers {count}: recomputed as every "
                "layer (distsim checkpoints each layer; uniform groups recompute the same)"
            )
    if get.switch("sequence-parallel"):
        out["sequence_parallel"] = True
    if get.switch("use-distributed-optimizer"):
        out["optimizer_sharding"] = "zero1"
    ep = get.integer("expert-model-parallel-size", 1)
    if ep > 1:
        out["ep"] = ep
    cp = get.integer("context-parallel-size", 1)
    if cp > 1:
        out["cp"] = cp
    return out


def _vocab(get: _Getter) -> int:
    if "padded-vocab-size" in get.flags:
        return get.integer("padded-vocab-size")
    if "vocab-size" in get.flags:
        return get.integer("vocab-size")
    named = " ".join(str(get.flags.get(k) or "") for k in ("tokenizer-model", "tokenizer-type")).lower()
    for key, size in TOKENIZER_VOCAB:
        if key in named.replace("_", "-").replace("bpe", "").replace("gpt2tokenizer", "gpt2"):
            get.used.update(k for k in ("tokenizer-model", "tokenizer-type") if k in get.flags)
            return size
    raise MegatronArgsError("the vocabulary size is not known from the tokenizer named; give --vocab-size N")


def _precision(get: _Getter) -> str:
    if get.flags.get("fp8-format") is not None:
        get.used.add("fp8-format")
        if get.switch("fp16"):
            raise MegatronArgsError("--fp8-format with --fp16: distsim models FP8 over bf16 (Transformer Engine's "
                                    "recipe with --bf16)")  # fmt: skip
        get.switch("bf16")
        return "fp8"
    if get.switch("bf16"):
        return "bf16-mixed"
    get.switch("fp16")
    return "fp16-mixed"  # Megatron's default trains in fp32; launch lines that matter name a half precision


class _Getter:
    """Reads flags, remembering which were used."""

    def __init__(self, flags: dict[str, str | None]):
        self.flags = flags
        self.used: set[str] = set()
        self.notes: list[str] = []

    def _raw(self, name: str) -> str | None:
        self.used.add(name)
        value = self.flags[name]
        if value is None:
            raise MegatronArgsError(f"--{name} needs a value")
        return value

    def integer(self, name: str, default: Any = ..., minimum: int = 1) -> Any:
        if name not in self.flags:
            if default is ...:
                raise MegatronArgsError(f"--{name} is missing; the model needs it")
            return default
        raw = self._raw(name)
        if not raw.isdigit() or int(raw) < minimum:
            raise MegatronArgsError(f"--{name} must be a whole number >= {minimum}, got {raw!r}")
        return int(raw)

    def number(self, name: str, default: float) -> float:
        if name not in self.flags:
            return default
        raw = self._raw(name)
        try:
            return float(raw)
        except ValueError:
            raise MegatronArgsError(f"--{name} must be a number, got {raw!r}") from None

    def choice(self, name: str, choices: dict[str, str], default: str | None) -> Any:
        if name not in self.flags:
            return None if default is None else choices[default]
        raw = self._raw(name)
        if raw not in choices:
            raise MegatronArgsError(f"--{name} must be one of {', '.join(choices)}, got {raw!r}")
        return choices[raw]

    def switch(self, name: str) -> bool:
        if name in self.flags:
            self.used.add(name)
            return True
        return False
