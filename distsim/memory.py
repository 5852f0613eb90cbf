"""Peak memory per GPU: training state plus the activations of in-flight micro-batches.

Training state is the rank's parameter shard times the precision's bytes per parameter for weights, gradients and
optimizer state (16 B per parameter for mixed precision with Adam; DAPPLE Table VIII). Activations are those kept for
backward (per layer, Korthikanti et al. 2022 for transformers) times the micro-batches whose forward has run and whose
backward has not, maximised over the rank's schedule: K_i micro-batches for 1F1B (DAPPLE Sec. III-B), M for GPipe,
and the chunk-weighted peak for interleaved schedules.
"""

from __future__ import annotations

from dataclasses import dataclass

from distsim.models.graph import Model
from distsim.partition import rank_layers
from distsim.schedules import Schedule, peak_in_flight
from distsim.strategy import Strategy


@dataclass(frozen=True)
class MemoryEstimate:
    rank: int
    """Pipeline rank (every tp and dp peer of it holds the same amount)."""
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    in_flight_microbatches: float
    capacity_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    def to_dict(self) -> dict[str, float | int | bool]:
        return {
            "rank": self.rank,
            "params_bytes": self.params_bytes,
            "grads_bytes": self.grads_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "activations_bytes": self.activations_bytes,
            "in_flight_microbatches": self.in_flight_microbatches,
            "total_bytes": self.total_bytes,
            "fits": self.fits,
        }


def estimate_memory(
    model: Model,
    strategy: Strategy,
    schedule: Schedule,
    stage_ranges: tuple[tuple[int, int], ...],
    capacity_bytes: float,
    stage_samples: list[int] | None = None,
) -> list[MemoryEstimate]:
    """One estimate per pipeline rank.

    `stage_samples` gives the samples of a micro-batch each (virtual) stage's busiest replica processes when they
    differ from the strategy's micro-batch size (a plan whose stages split micro-batches over replicas).
    """
    p, tp = model.precision, strategy.tp
    samples = stage_samples or [strategy.micro_batch_size] * len(stage_ranges)
    act_per_stage = {
        vs: samples[vs] * sum(model.layers[i].saved_bytes_per_sample(tp) for i in range(start, end))
        for vs, (start, end) in enumerate(stage_ranges)
    }
    out = []
    for r, actions in enumerate(schedule.ranks):
        shard = model.rank_params(rank_layers(stage_ranges, strategy.pp, r), tp)
        out.append(
            MemoryEstimate(
                rank=r,
                params_bytes=shard * p.param_bytes,
                grads_bytes=shard * p.grad_bytes,
                optimizer_bytes=shard * p.optimizer_bytes,
                activations_bytes=peak_in_flight(actions, act_per_stage),
                in_flight_microbatches=peak_in_flight(actions),
                capacity_bytes=capacity_bytes,
            )
        )
    return out
