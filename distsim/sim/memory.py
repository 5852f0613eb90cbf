"""Peak memory per GPU: training state plus the activations of in-flight micro-batches.

**Training state** (Rajbhandari et al. 2020, "ZeRO", Sec. 3.1 and Figure 1). A rank's parameter shard of Psi
parameters (its pipeline layers, split over tp) keeps the precision's bytes per parameter for weights, gradients and
optimizer state: 2Psi + 2Psi + K Psi with K = 12 for mixed-precision Adam, 16 B per parameter (DAPPLE Table VIII
agrees). ZeRO-DP partitions them over the d data-parallel replicas (ZeRO Sec. 5.1-5.3, Figure 1):

* ``zero1`` (P_os, Megatron's distributed optimizer): 2Psi + 2Psi + K Psi / d;
* ``zero2`` (P_os+g): 2Psi + (2 + K) Psi / d;
* ``zero3`` (P_os+g+p, FSDP): (2 + 2 + K) Psi / d, plus the parameters all-gathered for the layers in flight: the
  layer computing and one prefetched (FSDP's default ``BackwardPrefetch.BACKWARD_PRE`` gathers the next layer
  during the current one's backward), so twice the rank's largest layer shard (over tp, whole over dp) at
  ``param_bytes``. ZeRO's Figure 1 leaves these buffers out; they are small next to the state for deep stages and
  are what keeps a one-layer rank from gaining. Other temporary buffers (gradient buckets, the full gradient of a
  layer before its reduce-scatter) are not counted, as in ZeRO's model-state formula.

**Activations** (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"). Each
layer keeps, per sample, ``saved_bytes`` on every tp rank and ``saved_sharded_bytes`` / t (Sec. 4.2.1: a transformer
layer sbh(10 + 24/t + 5as/(ht)), Sec. 4.1 having derived sbh(34 + 5as/h) without it). Per layer and mode (Table 2):

* sequence parallelism (``sequence_parallel``, Sec. 4.2.2) also divides the ``saved_sp_bytes`` part of
  ``saved_bytes`` by t: sbh/t (34 + 5as/h) for a transformer layer;
* ``selective`` recomputation (Sec. 5) drops the attention core ``saved_core_bytes`` / t (5as/h of the per-layer
  formula) and rebuilds it in backward: sbh(10 + 24/t), or sbh 34/t with sequence parallelism. A layer without an
  attention core (CNN, model files without ``saved_core_bytes``) is unchanged;
* ``full`` recomputation (Sec. 5) keeps only each recomputed layer's input, the outputs of its input layers (2sbh
  for a transformer layer). Table 2 gives 2sbh; Sec. 5 notes it shrinks to 2sbh/t when each tp rank stores only its
  part, which costs an extra all-gather per layer without sequence parallelism (the paper does not use that), but is
  how the input already lies with it: Megatron keeps the residual stream sequence-sharded between layers, so a layer
  with sequence-parallel activations (``saved_sp_bytes`` > 0) keeps its input divided by t. Layers not re-run
  (``recomputable`` False: Megatron checkpoints transformer layers, not the embedding or the LM head) keep their
  activations. Rule for any other layer (CNN, model files, profiled modules): it keeps the outputs of its input
  layers, or its own activations when those are smaller (a concat keeps nothing itself); a layer with no input layer
  (the first) keeps nothing, its input being the data batch, which no layer's figures count. A tensor feeding several
  recomputed layers (T5's encoder output) is counted at each, as ``saved_bytes`` already counts fan-out.

``recompute_layers = N`` recomputes only the first N eligible layers of each (virtual) stage, the others keeping
everything: Megatron-LM's ``--recompute-method block --recompute-num-layers N`` (per pipeline stage, per model chunk
when interleaved), not its ``uniform`` method, which recomputes every layer in groups of N. Megatron accepts the
method for full recomputation only; for selective the same first-N rule is applied here.

**The attention kernel.** The 5as/h term is the s x s attention scores (softmax output, its dropout mask, the dropout
output) that the ``unfused`` and ``fused_softmax`` attention kernels store. A transformer layer's figures follow the
kernel its attention ops run (:data:`distsim.core.models.ops.ATTENTION_IMPLS`, the model's ``attention``): with
``flash`` attention (the default) the core keeps only its fp32 log-sum-exp, 4as bytes per sequence instead of 5as^2,
which is then all that selective recomputation drops. The scores kept at the peak are reported as a part of the
activations (``attention_scores_bytes``: the layers' :attr:`~distsim.core.models.ops.AttentionOp.saved_scores_bytes`
/ t, none where recomputation drops them), so that a user sees what a stored-score kernel costs.

The peak of a rank is the largest total over its schedule of the micro-batches whose forward has run and whose
backward has not (K_i for 1F1B, DAPPLE Sec. III-B; M for GPipe; the chunk-weighted peak when interleaved): under
1F1B the first stage holds p micro-batches of L/p layers, Korthikanti Sec. 4.2.3's L layers' worth, and more when
interleaved. Recomputation adds, on top of that, the activations being rebuilt for one layer of one micro-batch
during its backward: the largest recomputed layer's full activations less what it kept (the checkpointed input is
part of them), or its attention core under selective recomputation. This is the checkpointing cost model of Chen et
al. 2016, "Training Deep Nets with Sublinear Memory Cost", Sec. 4 (the stored segment inputs plus one segment re-run
at a time); Korthikanti's Table 2 counts only the stored part.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from distsim.core.errors import DistsimError
from distsim.core.models.graph import Model
from distsim.core.models.ops import AttentionOp
from distsim.core.partition import rank_layers
from distsim.core.schedules import Action, Schedule, build_schedule
from distsim.core.strategy import Strategy
from distsim.sim.flow.events import memoised
from distsim.sim.flow.recompute import eligible_layers
from distsim.sim.flow.recompute import recomputed_layers as flow_recomputed

ZERO3_GATHERED_LAYERS = 2
"""Layers whose whole (over dp) parameters a zero3 rank holds at once: the one computing and one prefetched."""


@dataclass(frozen=True)
class LayerActivations:
    """Bytes per sample one layer keeps under a strategy (see the module docstring for the formulas)."""

    stored: float
    """Kept from its forward to its backward."""
    rebuilt: float
    """Rebuilt during its backward by recomputation (0 when it is not recomputed)."""
    unrecomputed: float
    """What it would keep with no recomputation (the same tp and sequence parallelism)."""
    scores: float = 0.0
    """Of ``stored``, the s x s attention scores its stored-score attention cores keep (0 under flash attention, or
    when recomputation drops them)."""


def attention_scores_bytes(model: Model, i: int) -> float:
    """Bytes per sample (whole, before tp divides them) of the s x s attention scores layer i's attention ops keep
    for backward: softmax output, dropout mask and dropout output of an ``unfused`` or ``fused_softmax`` core
    (Korthikanti et al. 2022 Sec. 4.1's 5as^2); 0 for flash attention and for layers without attention ops."""
    return sum(op.saved_scores_bytes for b in model.layers[i].blocks for op in b.ops if isinstance(op, AttentionOp))


def layer_activations(model: Model, i: int, tp: int, sequence_parallel: bool, mode: str) -> LayerActivations:
    """Layer i's activation bytes per sample when it is recomputed under `mode` (none, selective or full).

    Korthikanti et al. 2022, Table 2 for a transformer layer (b = 1): none sh(10 + 24/t + 5as/(ht)), with sequence
    parallelism sh/t (34 + 5as/h); selective sh(10 + 24/t) or sh 34/t; full 2sh (2sh/t with sequence parallelism).
    """
    layer = model.layers[i]
    sp = sequence_parallel and tp > 1
    whole = layer.saved_bytes - layer.saved_sp_bytes + layer.saved_sp_bytes / (tp if sp else 1)
    full = whole + layer.saved_sharded_bytes / tp
    scores = min(attention_scores_bytes(model, i) / tp, full)  # the scores split over tp with the heads
    if mode == "selective":
        core = layer.saved_core_bytes / tp
        return LayerActivations(full - core, core, full, max(0.0, scores - core))
    if mode == "full" and layer.recomputable:
        inputs = sum(model.layers[u].out_bytes for u in model.input_layers[i])
        kept = min(inputs / (tp if sp and layer.saved_sp_bytes > 0 else 1), full)
        return LayerActivations(kept, full - kept, full)
    return LayerActivations(full, 0.0, full, scores)


@dataclass(frozen=True)
class _Peaks:
    activations: float
    in_flight: float
    unrecomputed: float
    scores_at_peak: float
    stages: frozenset[int]


def _peaks(actions: Sequence[Action], kept: dict[int, float], unrecomputed: dict[int, float],
           scores: dict[int, float]) -> _Peaks:  # fmt: skip
    """In one pass over a rank's actions (a grid search checks the memory of every configuration): the peaks of its
    in-flight `kept` and `unrecomputed` activation bytes and micro-batch count (each
    :func:`~distsim.core.schedules.peak_in_flight`, summed in the same order: equal to the last bit), the in-flight
    `scores` at the moment `kept` first peaks (the attention scores of the peak's activations), and the stages it
    runs."""
    live = peak = count = peak_count = lost = peak_lost = live_scores = at = 0.0
    stages = set()
    for a in actions:
        stage = a.stage
        stages.add(stage)
        if a.op == "F":
            live += kept[stage]
            count += 1.0
            lost += unrecomputed[stage]
            live_scores += 1.0 * scores[stage]
        else:
            live += -kept[stage]
            count += -1.0
            lost += -unrecomputed[stage]
            live_scores += -1.0 * scores[stage]
        if live > peak:
            peak, at = live, live_scores
        if count > peak_count:
            peak_count = count
        if lost > peak_lost:
            peak_lost = lost
    return _Peaks(peak, peak_count, peak_lost, at, frozenset(stages))


def recomputed_layers(model: Model, strategy: Strategy, stage_ranges: tuple[tuple[int, int], ...]) -> frozenset[int]:
    """Indices of the layers the strategy recomputes: every eligible layer of each (virtual) stage, or its first
    ``recompute_layers`` (Megatron's block method); the same rule as the event flow's
    (:func:`distsim.sim.flow.recompute.recomputed_layers`), so that time and memory agree."""
    if strategy.recompute == "none":
        return frozenset()
    eligible = eligible_layers(model, strategy.recompute)
    return frozenset().union(*(flow_recomputed(model, strategy, r, eligible) for r in stage_ranges))


@dataclass(frozen=True)
class MemoryEstimate:
    """One pipeline rank's peak memory by part, with what recomputation and optimizer sharding changed."""

    rank: int
    """Pipeline rank (every tp and dp peer of it holds the same amount)."""
    params_bytes: float
    """The rank's parameter shard (divided by dp under zero3)."""
    grads_bytes: float
    """Its gradients (divided by dp under zero2 and zero3)."""
    optimizer_bytes: float
    """Its optimizer state (divided by dp under any ZeRO stage)."""
    activations_bytes: float
    """Activations kept by the in-flight micro-batches at the rank's peak, under its recomputation mode."""
    in_flight_microbatches: float
    capacity_bytes: float
    recompute_bytes: float = 0.0
    """Activations rebuilt for one layer of one micro-batch during a backward (recomputation only)."""
    gathered_params_bytes: float = 0.0
    """Parameters all-gathered over dp for the layers in flight (zero3 only)."""
    unrecomputed_activations_bytes: float = 0.0
    """What ``activations_bytes`` would be with no recomputation (same tp and sequence parallelism)."""
    attention_scores_bytes: float = 0.0
    """Of ``activations_bytes``, the s x s attention scores kept (softmax output, dropout mask and dropout output of
    an ``unfused`` or ``fused_softmax`` attention core; Korthikanti et al. 2022's 5as^2 per sequence and layer) at
    the rank's peak: 0 with flash attention, or where recomputation drops them."""
    unsharded_states_bytes: float = 0.0
    """What the training state would be with no optimizer sharding."""
    recompute: str = "none"
    sequence_parallel: bool = False
    optimizer_sharding: str = "none"

    @property
    def states_bytes(self) -> float:
        """Training state: parameters, gradients, optimizer state and zero3's gathered parameters."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.gathered_params_bytes

    @property
    def all_activations_bytes(self) -> float:
        """Activations at the peak: those kept plus the layer being rebuilt."""
        return self.activations_bytes + self.recompute_bytes

    @property
    def total_bytes(self) -> float:
        return self.states_bytes + self.all_activations_bytes

    @property
    def recompute_saved_bytes(self) -> float:
        """Memory recomputation saves at the peak (the kept activations it drops less the layer it rebuilds)."""
        return self.unrecomputed_activations_bytes - self.all_activations_bytes

    @property
    def sharding_saved_bytes(self) -> float:
        """Memory optimizer sharding saves (the state it partitions less zero3's gathered parameters)."""
        return self.unsharded_states_bytes - self.states_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    def describe_parts(self, unit: float = 1e9, name: str = "GB") -> str:
        """Each part in one line: the state (with what ZeRO changes) and the activations (with what recomputation
        changes), e.g. ``params 2.92 + grads 2.92 + optimizer 2.19 GB (zero1: -15.35 GB); activations 5.23 GB kept +
        0.53 GB rebuilding one layer (recompute full: -50.21 GB)``; where stored attention scores are kept, their part
        follows the kept activations: ``activations 60.78 GB kept (attention scores 26.42 GB)``."""
        states = f"params {self.params_bytes / unit:.2f} + grads {self.grads_bytes / unit:.2f} + optimizer "
        states += f"{self.optimizer_bytes / unit:.2f}"
        if self.gathered_params_bytes:
            states += f" + gathered {self.gathered_params_bytes / unit:.2f}"
        states += f" {name}"
        if self.optimizer_sharding != "none":
            states += f" ({self.optimizer_sharding}: {-self.sharding_saved_bytes / unit:+.2f} {name})"
        acts = f"activations {self.activations_bytes / unit:.2f} {name} kept"
        if self.attention_scores_bytes:
            acts += f" (attention scores {self.attention_scores_bytes / unit:.2f} {name})"
        if self.recompute_bytes:
            acts += f" + {self.recompute_bytes / unit:.2f} {name} rebuilding one layer"
        if self.recompute != "none":
            acts += f" (recompute {self.recompute}: {-self.recompute_saved_bytes / unit:+.2f} {name})"
        if self.sequence_parallel:
            acts += ", sequence parallel"
        return f"{states}; {acts}"

    def to_dict(self) -> dict[str, float | int | bool | str]:
        return {
            "rank": self.rank,
            "params_bytes": self.params_bytes,
            "grads_bytes": self.grads_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "gathered_params_bytes": self.gathered_params_bytes,
            "states_bytes": self.states_bytes,
            "activations_bytes": self.activations_bytes,
            "attention_scores_bytes": self.attention_scores_bytes,
            "recompute_bytes": self.recompute_bytes,
            "in_flight_microbatches": self.in_flight_microbatches,
            "total_bytes": self.total_bytes,
            "fits": self.fits,
            "recompute": self.recompute,
            "sequence_parallel": self.sequence_parallel,
            "optimizer_sharding": self.optimizer_sharding,
            "unrecomputed_activations_bytes": self.unrecomputed_activations_bytes,
            "recompute_saved_bytes": self.recompute_saved_bytes,
            "unsharded_states_bytes": self.unsharded_states_bytes,
            "sharding_saved_bytes": self.sharding_saved_bytes,
        }


def estimate_memory(
    model: Model,
    strategy: Strategy,
    schedule: Schedule,
    stage_ranges: tuple[tuple[int, int], ...],
    capacity_bytes: float,
    stage_samples: list[int] | None = None,
) -> list[MemoryEstimate]:
    """One estimate per pipeline rank, under the strategy's recomputation, sequence parallelism and sharding.

    `stage_samples` gives the samples of a micro-batch each (virtual) stage's busiest replica processes when they
    differ from the strategy's micro-batch size (a plan whose stages split micro-batches over replicas). A strategy's
    own schedule is estimated once per search (:func:`~distsim.sim.flow.events.shared_partitions`: a grid checks a
    configuration's memory, then simulates it, which estimates it again).
    """
    if stage_samples is None and _own_schedule(strategy, schedule):
        question = (strategy, stage_ranges, capacity_bytes)
        estimate = lambda: _estimate_memory(model, strategy, schedule, stage_ranges, capacity_bytes)  # noqa: E731
        return list(memoised("memory", model, None, question, estimate))
    return _estimate_memory(model, strategy, schedule, stage_ranges, capacity_bytes, stage_samples)


def _own_schedule(strategy: Strategy, schedule: Schedule) -> bool:
    """Whether `schedule` is the one :func:`~distsim.core.schedules.build_schedule` gives `strategy` (the same object:
    schedules are cached)."""
    try:
        return schedule is build_schedule(strategy)
    except DistsimError:
        return False


def _estimate_memory(
    model: Model,
    strategy: Strategy,
    schedule: Schedule,
    stage_ranges: tuple[tuple[int, int], ...],
    capacity_bytes: float,
    stage_samples: list[int] | None = None,
) -> list[MemoryEstimate]:
    p, tp, sp = model.precision, strategy.tp, strategy.sequence_parallel
    samples = stage_samples or [strategy.micro_batch_size] * len(stage_ranges)
    recomputed = recomputed_layers(model, strategy, stage_ranges)
    kept: dict[int, float] = {}
    rebuilt: dict[int, float] = {}
    unrecomputed: dict[int, float] = {}
    scores: dict[int, float] = {}
    for vs, (start, end) in enumerate(stage_ranges):
        acts = [
            layer_activations(model, i, tp, sp, strategy.recompute if i in recomputed else "none")
            for i in range(start, end)
        ]
        kept[vs] = samples[vs] * sum(a.stored for a in acts)
        rebuilt[vs] = samples[vs] * max((a.rebuilt for a in acts), default=0.0)
        unrecomputed[vs] = samples[vs] * sum(a.unrecomputed for a in acts)
        scores[vs] = samples[vs] * sum(a.scores for a in acts)
    d = strategy.dp if strategy.optimizer_sharding != "none" else 1
    zero = strategy.optimizer_sharding
    out = []
    for r, actions in enumerate(schedule.ranks):
        peaks = _peaks(actions, kept, unrecomputed, scores)
        held = rank_layers(stage_ranges, strategy.pp, r)
        shard = model.rank_params(held, tp)
        gathered = 0.0
        if zero == "zero3" and d > 1:
            largest = max((model.stored_params(i, set(held), tp) for i in held), default=0.0)
            gathered = ZERO3_GATHERED_LAYERS * largest * p.param_bytes
        out.append(
            MemoryEstimate(
                rank=r,
                params_bytes=shard * p.param_bytes / (d if zero == "zero3" else 1),
                grads_bytes=shard * p.grad_bytes / (d if zero in ("zero2", "zero3") else 1),
                optimizer_bytes=shard * p.optimizer_bytes / d,
                activations_bytes=peaks.activations,
                in_flight_microbatches=peaks.in_flight,
                capacity_bytes=capacity_bytes,
                recompute_bytes=max((rebuilt[vs] for vs in peaks.stages), default=0.0),
                gathered_params_bytes=gathered,
                unrecomputed_activations_bytes=peaks.unrecomputed,
                attention_scores_bytes=peaks.scores_at_peak,
                unsharded_states_bytes=shard * p.state_bytes_per_param,
                recompute=strategy.recompute,
                sequence_parallel=sp,
                optimizer_sharding=zero,
            )
        )
    return out
