"""The three concerns a :class:`~distsim.core.strategy.Strategy` is made of, each with its own checks: the parallel
degrees (as torchtitan's ``ParallelDims``, degrees only: tensor, pipeline and data, with room for the expert and
context parallelism to come), the pipeline (micro-batching, the schedule, virtual stages, the warm-up policy, the
partition) and the passes that rewrite a flow (gradient synchronisation, recomputation, sequence parallelism,
optimizer sharding). Names are checked against the registries they select from (:mod:`distsim.core.schedules`,
:mod:`distsim.core.sync`), so nothing here imports above the core.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from distsim.core.errors import StrategyError
from distsim.core.schedules import SCHEDULES
from distsim.core.sync import DDP_BUCKET_CAP_MB, MODES, SHARDINGS

MAX_MICRO_BATCH_SIZE = 2**30
"""Samples in one micro-batch at most (as a burst plan's batch): far beyond any model's memory, within exact float
arithmetic of sizes and times."""
WARMUP_POLICIES = ("A", "B")
RECOMPUTE_MODES = ("none", "selective", "full")
"""The recomputation modes of :mod:`distsim.sim.flow.recompute` (a test checks the two agree)."""
SHARDING_MODES = tuple(SHARDINGS)
"""The optimizer shardings of :mod:`distsim.core.sync` (none, zero1, zero2, zero3)."""
SCHEDULE_ALIASES = {"dapple": "1f1b", "1f1b-interleaved": "interleaved", "interleaved-1f1b": "interleaved"}


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise StrategyError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class ParallelDims:
    """How many GPUs split each layer (tp), the layers (pp) and the batch (dp)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    """Expert parallelism: the experts of a mixture-of-experts layer spread over ep data-parallel replicas (carved
    out of dp, as Megatron-Core does: consecutive replicas form an expert-parallel group)."""
    cp: int = 1
    """Context parallelism: cp consecutive replicas share each sequence (s/cp tokens each, ring attention), so dp
    counts dp / cp distinct batches (Megatron's dp is this dp / cp)."""

    def check(self) -> None:
        for name in ("tp", "pp", "dp", "ep", "cp"):
            _positive_int(name, getattr(self, name))
        if self.dp % self.cp:
            raise StrategyError(f"cp={self.cp} must divide dp={self.dp}: context-parallel groups are consecutive "
                                "replicas that share each sequence")  # fmt: skip
        if self.cp > 1 and self.ep > 1:
            raise StrategyError("context and expert parallelism together are not modelled yet")
        if self.dp % self.ep:
            raise StrategyError(f"ep={self.ep} must divide dp={self.dp}: expert-parallel groups are carved out of the "
                                "data-parallel replicas")  # fmt: skip

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def __str__(self) -> str:
        return f"{self.tp}M{self.pp}P{self.dp}D"


@dataclass(frozen=True)
class PipelineSpec:
    """Micro-batching and the pipeline schedule of one data-parallel replica."""

    micro_batch_size: int = 1
    num_micro_batches: int = 1
    schedule: str = "1f1b"
    partition: tuple[int, ...] | None = None
    virtual_stages: int | None = None
    warmup_policy: str = "A"
    max_in_flight: int | None = None

    def checked(self, dims: ParallelDims) -> PipelineSpec:
        """The spec with canonical values (schedule alias resolved, policy upper-cased, virtual stages filled in);
        StrategyError names the first problem."""
        for name in ("micro_batch_size", "num_micro_batches"):
            _positive_int(name, getattr(self, name))
        if self.micro_batch_size > MAX_MICRO_BATCH_SIZE:
            raise StrategyError(f"micro_batch_size is {self.micro_batch_size:,} samples, above the limit of "
                                f"{MAX_MICRO_BATCH_SIZE:,}")  # fmt: skip
        schedule = SCHEDULE_ALIASES.get(str(self.schedule).lower(), str(self.schedule).lower())
        if schedule not in SCHEDULES:
            raise StrategyError(f"unknown schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}")
        policy = str(self.warmup_policy).upper()
        if policy not in WARMUP_POLICIES:
            raise StrategyError(f"warm-up policy must be A or B, got {self.warmup_policy!r}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise StrategyError(f"max_in_flight (D) must be >= 1, got {self.max_in_flight}")
        spec = replace(self, schedule=schedule, warmup_policy=policy)
        spec = replace(spec, virtual_stages=spec._virtual_stages(dims))
        spec._check_partition(dims)
        return replace(spec, partition=None if spec.partition is None else tuple(spec.partition))

    def _virtual_stages(self, dims: ParallelDims) -> int:
        v = self.virtual_stages
        if self.schedule != "interleaved":
            if v not in (None, 1):
                raise StrategyError(f"virtual_stages={v} needs schedule=interleaved (got {self.schedule})")
            return 1
        v = 2 if v is None else v
        if v < 2:
            raise StrategyError(f"interleaved needs virtual_stages >= 2, got {v}")
        if dims.pp < 2:
            raise StrategyError("the interleaved schedule needs pp >= 2")
        if self.num_micro_batches % dims.pp:
            raise StrategyError(
                f"too few micro-batches for the interleaved schedule: M={self.num_micro_batches} must be a "
                f"multiple of pp={dims.pp} (Megatron-LM's interleaved 1F1B requirement)"
            )
        return v

    def _check_partition(self, dims: ParallelDims) -> None:
        if self.partition is None:
            return
        part = tuple(self.partition)
        stages = dims.pp * (self.virtual_stages or 1)
        if len(part) != stages:
            virtual = "virtual " if (self.virtual_stages or 1) > 1 else ""
            raise StrategyError(f"partition has {len(part)} entries but the strategy has {stages} {virtual}stages")
        if any(not isinstance(n, int) or n < 1 for n in part):
            raise StrategyError(f"every stage of the partition needs at least one layer, got {part}")


@dataclass(frozen=True)
class Passes:
    """What rewrites the flow of an iteration besides its parallel layout."""

    grad_sync: str = "bulk"
    bucket_cap_mb: float = DDP_BUCKET_CAP_MB
    grad_groups: tuple[tuple[int, int], ...] = ()
    recompute: str = "none"
    recompute_layers: int | None = None
    sequence_parallel: bool = False
    optimizer_sharding: str = "none"

    def checked(self, dims: ParallelDims) -> Passes:
        """The passes with canonical values (the cap a float, the groups integer pairs)."""
        if self.grad_sync not in MODES:
            raise StrategyError(f"unknown grad_sync {self.grad_sync!r}; choose one of {', '.join(MODES)}")
        passes = self._checked_grad_options()
        passes._check_memory_options(dims)
        return passes

    def _checked_grad_options(self) -> Passes:
        cap = self.bucket_cap_mb
        if isinstance(cap, bool) or not isinstance(cap, int | float) or not (0 < cap < float("inf")):
            raise StrategyError(f"bucket_cap_mb must be a positive number of MiB, got {cap!r}")
        groups = tuple((int(lo), int(hi)) for lo, hi in self.grad_groups)
        if groups and not self.grad_sync.startswith("mgwfbp"):
            raise StrategyError(f"gradient groups are a merge plan of grad_sync mgwfbp, not {self.grad_sync}")
        for (lo, hi), nxt in zip(groups, [*groups[1:], None], strict=False):
            if not 0 <= lo < hi:
                raise StrategyError(f"gradient group {lo}-{hi} is not a layer range [start, end) with start < end")
            if nxt is not None and nxt[0] != hi:
                raise StrategyError(f"gradient groups must be consecutive: {lo}-{hi} is followed by {nxt[0]}-{nxt[1]}")
        return replace(self, bucket_cap_mb=float(cap), grad_groups=groups)

    def _check_memory_options(self, dims: ParallelDims) -> None:
        if self.recompute not in RECOMPUTE_MODES:
            raise StrategyError(f"unknown recompute {self.recompute!r}; choose one of {', '.join(RECOMPUTE_MODES)}")
        n = self.recompute_layers
        if n is not None:
            if self.recompute == "none":
                raise StrategyError("recompute_layers needs recompute selective or full")
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise StrategyError(f"recompute_layers must be a positive integer, got {n!r}")
        if not isinstance(self.sequence_parallel, bool):
            raise StrategyError(f"sequence_parallel must be true or false, got {self.sequence_parallel!r}")
        if self.sequence_parallel and dims.tp == 1:
            raise StrategyError(
                "sequence parallelism splits the sequence over the tensor-parallel group: it needs tp > 1"
            )
        if self.optimizer_sharding not in SHARDING_MODES:
            raise StrategyError(
                f"unknown optimizer_sharding {self.optimizer_sharding!r}; choose one of {', '.join(SHARDING_MODES)}"
            )
