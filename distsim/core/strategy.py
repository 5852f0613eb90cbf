"""Strategy: a validated value object for a hybrid tensor x pipeline x data-parallel training plan.

``Strategy.from_str`` reads DistSim's ``2M4P2D`` notation (model/tensor, pipeline, data degrees; Sec. 5.1) and the
readable ``tp=2 pp=4 dp=2 mbs=1 mb=8 schedule=1f1b`` form that ``describe()`` writes, so both round-trip.
``check_strategy`` validates a strategy against a model and a cluster and names the exact problem.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from distsim.core.errors import StrategyError
from distsim.core.models.context import context_problem
from distsim.core.models.moe import expert_counts
from distsim.core.parallel import (
    MAX_MICRO_BATCH_SIZE,
    RECOMPUTE_MODES,
    SHARDING_MODES,
    WARMUP_POLICIES,
    ParallelDims,
    Passes,
    PipelineSpec,
)
from distsim.core.sync import DDP_BUCKET_CAP_MB

if TYPE_CHECKING:
    from distsim.core.cluster import Cluster
    from distsim.core.models.graph import Model

__all__ = ["MAX_MICRO_BATCH_SIZE", "RECOMPUTE_MODES", "SHARDING_MODES", "WARMUP_POLICIES", "Strategy", "check_strategy"]


@dataclass(frozen=True)
class Strategy:
    """How one training iteration is parallelised: the flat, readable value users write (``Strategy(tp=2, ...)``,
    ``2M4P2D``), made of three concerns checked separately (:mod:`distsim.core.parallel`): :attr:`dims` (the
    degrees), :attr:`pipeline` (micro-batches, schedule, partition) and :attr:`passes` (gradient sync,
    recomputation, sequence parallelism, optimizer sharding)."""

    tp: int = 1
    """Tensor (model) parallel degree: GPUs that split each layer (Megatron-style)."""
    pp: int = 1
    """Pipeline parallel degree: number of pipeline ranks."""
    dp: int = 1
    """Data parallel degree: replicas of the whole pipeline."""
    micro_batch_size: int = 1
    """Samples per micro-batch on one replica."""
    num_micro_batches: int = 1
    """Micro-batches per iteration on one replica (M); global batch = dp x M x micro_batch_size."""
    schedule: str = "1f1b"
    """Pipeline schedule: gpipe, 1f1b (DAPPLE early backward) or interleaved (1F1B with virtual stages)."""
    partition: tuple[int, ...] | None = None
    """Layers per (virtual) stage in model order; None balances the estimated compute."""
    virtual_stages: int | None = None
    """Model chunks per pipeline rank (interleaved only; default 2)."""
    warmup_policy: str = "A"
    """DAPPLE warm-up policy for 1f1b: A, K_i = min(S - i, D); B, K_i = min(2(S - i) - 1, D)."""
    max_in_flight: int | None = None
    """DAPPLE's D: most micro-batches a stage keeps in flight (1f1b); None means no limit beyond M."""
    grad_sync: str = "bulk"
    """Data-parallel gradient synchronisation, a mode of :mod:`distsim.core.sync`: bulk (one all-reduce after
    backward, DistSim), wfbp (per layer, overlapped), ddp (PyTorch DDP's buckets), mgwfbp or mgwfbp-optimal
    (MG-WFBP's merged layers)."""
    bucket_cap_mb: float = DDP_BUCKET_CAP_MB
    """DDP's bucket size in MiB (ddp only)."""
    grad_groups: tuple[tuple[int, int], ...] = ()
    """A merge plan (mgwfbp modes): layer ranges [start, end), each all-reduced as one message; empty: planned."""
    recompute: str = "none"
    """Activation recomputation (Korthikanti et al. 2022): none, selective (the attention core is recomputed in
    backward) or full (each block's forward runs again before its backward; only block inputs are kept)."""
    recompute_layers: int | None = None
    """Recompute only the first N layers of each stage (Megatron's recompute_num_layers); None: every layer."""
    sequence_parallel: bool = False
    """Megatron's sequence parallelism (tp > 1): the tp all-reduces become reduce-scatter + all-gather pairs around
    layer norm and dropout, whose activations divide by tp."""
    optimizer_sharding: str = "none"
    """Optimizer state sharded over the data-parallel group: none, zero1 (optimizer states), zero2 (and gradients:
    reduce-scatter instead of all-reduce), zero3 (and parameters: all-gathered before each layer's forward and
    backward, as FSDP)."""
    ep: int = 1
    """Expert parallelism (mixture-of-experts models): each expert-parallel group of ep consecutive replicas holds
    1/ep of each layer's experts and exchanges the routed tokens by all-to-all; ep must divide dp."""
    cp: int = 1
    """Context parallelism: each group of cp consecutive replicas shares its sequences, s/cp tokens per GPU, the
    attention's keys and values passed around the group's ring; cp must divide dp, and the global batch is
    dp / cp x M x micro-batch size (Megatron's --context-parallel-size with its dp = this dp / cp)."""

    def __post_init__(self) -> None:
        """Each concern checks its own fields (:mod:`distsim.core.parallel`); the checked, canonical values (the
        schedule's alias resolved, the policy upper-cased, virtual stages filled in) are written back."""
        dims = self.dims
        dims.check()
        for part in (self.pipeline.checked(dims), self.passes.checked(dims)):
            for f in fields(part):
                object.__setattr__(self, f.name, getattr(part, f.name))

    @classmethod
    def of(cls, dims: ParallelDims, pipeline: PipelineSpec | None = None, passes: Passes | None = None) -> Strategy:
        """The strategy made of its three concerns."""
        parts = [dims, pipeline or PipelineSpec(), passes or Passes()]
        return cls(**{f.name: getattr(p, f.name) for p in parts for f in fields(p)})  # type: ignore[arg-type]

    # ------------------------------------------------------------------------------------------------ concerns
    @property
    def dims(self) -> ParallelDims:
        """The parallel degrees."""
        return ParallelDims(self.tp, self.pp, self.dp, self.ep, self.cp)

    @property
    def pipeline(self) -> PipelineSpec:
        """Micro-batching, the schedule and the partition."""
        return PipelineSpec(**{f.name: getattr(self, f.name) for f in fields(PipelineSpec)})

    @property
    def passes(self) -> Passes:
        """Gradient synchronisation, recomputation, sequence parallelism and optimizer sharding."""
        return Passes(**{f.name: getattr(self, f.name) for f in fields(Passes)})

    # ------------------------------------------------------------------------------------------------ derived
    @property
    def chunks(self) -> int:
        """Model chunks per pipeline rank (1 unless interleaved)."""
        return self.virtual_stages or 1

    @property
    def num_stages(self) -> int:
        """Pipeline stages counting virtual ones: pp x chunks."""
        return self.pp * self.chunks

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def global_batch_size(self) -> int:
        return self.dp // self.cp * self.num_micro_batches * self.micro_batch_size

    # ----------------------------------------------------------------------------------------------- notation
    def __str__(self) -> str:
        return f"{self.tp}M{self.pp}P{self.dp}D"

    def describe(self) -> str:
        """Readable form that from_str reads back to an equal Strategy."""
        parts = [
            f"tp={self.tp}",
            f"pp={self.pp}",
            f"dp={self.dp}",
            f"mbs={self.micro_batch_size}",
            f"mb={self.num_micro_batches}",
            f"schedule={self.schedule}",
        ]
        if self.ep > 1:
            parts.append(f"ep={self.ep}")
        if self.cp > 1:
            parts.append(f"cp={self.cp}")
        if self.schedule == "interleaved":
            parts.append(f"v={self.chunks}")
        if self.schedule == "1f1b" and self.warmup_policy != "A":
            parts.append(f"policy={self.warmup_policy}")
        if self.max_in_flight is not None:
            parts.append(f"D={self.max_in_flight}")
        if self.grad_sync != "bulk":
            parts.append(f"sync={self.grad_sync}")
        if self.bucket_cap_mb != DDP_BUCKET_CAP_MB:
            parts.append(f"cap={self.bucket_cap_mb:g}")
        if self.grad_groups:
            parts.append("groups=" + "/".join(f"{lo}-{hi}" for lo, hi in self.grad_groups))
        if self.recompute != "none":
            parts.append(f"recompute={self.recompute}")
        if self.recompute_layers is not None:
            parts.append(f"recompute_layers={self.recompute_layers}")
        if self.sequence_parallel:
            parts.append("sp=1")
        if self.optimizer_sharding != "none":
            parts.append(f"zero={self.optimizer_sharding}")
        if self.partition is not None:
            parts.append("partition=" + ":".join(map(str, self.partition)))
        return " ".join(parts)

    @classmethod
    def from_str(cls, text: str, **overrides: object) -> Strategy:
        """Parse ``2M4P2D`` (any order of the M/P/D terms, case-insensitive) or ``tp=2 pp=4 dp=2 ...``."""
        text = text.strip()
        compact = re.fullmatch(r"(?:(\d+)([mpd]))+", text, flags=re.IGNORECASE)
        if compact:
            degrees: dict[str, int] = {}
            for number, letter in re.findall(r"(\d+)([mpd])", text, flags=re.IGNORECASE):
                key = {"m": "tp", "p": "pp", "d": "dp"}[letter.lower()]
                if key in degrees:
                    raise StrategyError(f"strategy {text!r} gives the {letter.upper()} degree twice")
                degrees[key] = int(number)
            return cls(**{**degrees, **overrides})  # type: ignore[arg-type]
        if "=" in text:
            return cls(**{**_parse_readable(text), **overrides})  # type: ignore[arg-type]
        raise StrategyError(
            f"cannot read strategy {text!r}: write it as 2M4P2D (tensor M, pipeline P, data D degrees) "
            "or tp=2 pp=4 dp=2"
        )

    def with_(self, **changes: object) -> Strategy:
        return replace(self, **changes)  # type: ignore[arg-type]


_READABLE_KEYS = {
    "tp": "tp",
    "mp": "tp",
    "pp": "pp",
    "dp": "dp",
    "ep": "ep",
    "cp": "cp",
    "mbs": "micro_batch_size",
    "micro_batch_size": "micro_batch_size",
    "mb": "num_micro_batches",
    "m": "num_micro_batches",
    "micro_batches": "num_micro_batches",
    "num_micro_batches": "num_micro_batches",
    "schedule": "schedule",
    "v": "virtual_stages",
    "virtual_stages": "virtual_stages",
    "policy": "warmup_policy",
    "warmup_policy": "warmup_policy",
    "d": "max_in_flight",
    "max_in_flight": "max_in_flight",
    "sync": "grad_sync",
    "grad_sync": "grad_sync",
    "partition": "partition",
    "cap": "bucket_cap_mb",
    "bucket_cap_mb": "bucket_cap_mb",
    "groups": "grad_groups",
    "grad_groups": "grad_groups",
    "recompute": "recompute",
    "recompute_layers": "recompute_layers",
    "sp": "sequence_parallel",
    "sequence_parallel": "sequence_parallel",
    "zero": "optimizer_sharding",
    "optimizer_sharding": "optimizer_sharding",
}
_INT_FIELDS = {f.name for f in fields(Strategy) if f.type in ("int", "int | None")}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _flag(value: str) -> bool:
    """An on/off value: 1/true/yes/on or 0/false/no/off (any case); ValueError on anything else."""
    if value.lower() not in _TRUE + _FALSE:
        raise ValueError(value)
    return value.lower() in _TRUE


def _partition(value: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.split(r"[:/]", value))


_VALUE_FORMS: dict[str, tuple[Callable[[str], object], str]] = {
    "partition": (_partition, "layer counts per stage like 8:7:7:4"),
    "grad_groups": (lambda v: parse_groups(v), "layer ranges like 0-4/4-10"),
    "bucket_cap_mb": (float, "a number of MiB"),
    "sequence_parallel": (_flag, "1 or 0 (true/false, yes/no, on/off: sequence parallelism on or off)"),
}
"""Field -> (how its readable value is read, what it takes, for the error); integer fields take an integer and the
others (schedule, policy, sync, recompute, zero) a name, checked by Strategy itself."""


def _value_form(field_name: str) -> tuple[Callable[[str], object], str]:
    if field_name in _VALUE_FORMS:
        return _VALUE_FORMS[field_name]
    if field_name in _INT_FIELDS:
        return int, "an integer"
    return str, "a name"


def _parse_readable(text: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for item in re.split(r"[\s,]+", text):
        if not item:
            continue
        key, sep, value = item.partition("=")
        field_name = _READABLE_KEYS.get(key) or _READABLE_KEYS.get(key.lower())
        if not sep or field_name is None:
            raise StrategyError(
                f"cannot read {item!r} in strategy {text!r}; expected key=value with key in "
                "tp, pp, dp, ep, cp, mbs, mb, schedule, v, policy, D, sync, cap, groups, recompute, recompute_layers, "
                "sp, zero, partition"
            )
        if field_name in out:
            raise StrategyError(f"{key} is given twice in strategy {text!r}; give each key once")
        read, what = _value_form(field_name)
        try:
            out[field_name] = read(value)
        except ValueError:
            raise StrategyError(f"{key} must be {what} in strategy {text!r}, got {value!r}") from None
    return out


def parse_groups(value: str) -> tuple[tuple[int, int], ...]:
    """``0-4/4-10`` (layer ranges [start, end)) as ((0, 4), (4, 10)); ValueError on anything else."""
    out = []
    for part in filter(None, re.split(r"[/;]", value)):
        lo, sep, hi = part.partition("-")
        if not sep:
            raise ValueError(part)
        out.append((int(lo), int(hi)))
    return tuple(out)


def check_strategy(strategy: Strategy, model: Model, cluster: Cluster) -> None:
    """Raise StrategyError naming the first reason the strategy cannot run this model on this cluster."""
    if strategy.num_gpus != cluster.num_gpus:
        hint = ""
        if strategy.num_gpus % cluster.gpus_per_node == 0:
            hint = f" (use --nodes {strategy.num_gpus // cluster.gpus_per_node})"
        raise StrategyError(
            f"{strategy} uses tp*pp*dp = {strategy.tp}*{strategy.pp}*{strategy.dp} = {strategy.num_gpus} GPUs "
            f"but cluster {cluster.name} has {cluster.num_gpus}{hint}"
        )
    layers = model.num_layers
    if strategy.num_stages > layers:
        what = f"pp*v = {strategy.pp}*{strategy.chunks}" if strategy.chunks > 1 else f"pp={strategy.pp}"
        raise StrategyError(f"{what} exceeds the {layers} layers of {model.name}")
    if strategy.partition is not None and sum(strategy.partition) != layers:
        raise StrategyError(
            f"partition {':'.join(map(str, strategy.partition))} covers {sum(strategy.partition)} layers "
            f"but {model.name} has {layers}"
        )
    if strategy.grad_groups and (strategy.grad_groups[0][0] != 0 or strategy.grad_groups[-1][1] != layers):
        lo, hi = strategy.grad_groups[0][0], strategy.grad_groups[-1][1]
        raise StrategyError(f"gradient groups cover layers {lo}-{hi} but {model.name} has layers 0-{layers}")
    problem = model.tp_problem(strategy.tp)
    if problem:
        raise StrategyError(problem)
    if strategy.ep > 1:
        experts = expert_counts(model)
        if not experts:
            raise StrategyError(f"ep={strategy.ep} spreads the experts of a mixture-of-experts model; {model.name} has "
                                "none")  # fmt: skip
        if any(n % strategy.ep for n in experts):
            raise StrategyError(f"ep={strategy.ep} must divide the {experts[0]} experts of {model.name}")
    problem = context_problem(model, strategy.cp)
    if problem:
        raise StrategyError(problem)
    if model.precision.gemm_bytes == 1 and cluster.gpu.fp8_flops_per_s <= 0:
        raise StrategyError(f"{model.name} trains in fp8, but {cluster.gpu.name} has no FP8 tensor cores: use an H100 "
                            "or H200 cluster, or precision=bf16-mixed")  # fmt: skip
    if model.micro_batch_size is not None and strategy.micro_batch_size != model.micro_batch_size:
        raise StrategyError(
            f"{model.name} was profiled at micro-batch size {model.micro_batch_size} (its example batch), not "
            f"{strategy.micro_batch_size}: profile it with an example batch of {strategy.micro_batch_size}"
        )
