"""SimResult: one simulated iteration, its timeline, metrics and memory, and where every cost came from."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from distsim.core.cluster import Cluster
from distsim.core.models.graph import Model
from distsim.core.strategy import Strategy
from distsim.plans.plan import Plan
from distsim.sim import engine, metrics
from distsim.sim.flow.events import EventFlow, FlowOptions
from distsim.sim.memory import MemoryEstimate
from distsim.sim.metrics import GPUStatsTable
from distsim.sim.timeline import Timeline, from_flow

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class SimResult:
    """One simulated iteration: timeline of the simulated GPUs, metrics, memory, and where every cost came from."""

    model: Model
    cluster: Cluster
    strategy: Strategy
    options: FlowOptions
    flow: EventFlow = field(repr=False)
    tasks: engine.EngineResult = field(repr=False)
    """Start and end of every task of the flow (index = task id)."""
    memory: list[MemoryEstimate]
    cost_source: str
    wall_time_s: float
    """Seconds the simulation itself took (building the event flow and running it; the timeline is built when first
    asked for)."""
    sampled_iteration_s: list[float] | None = None
    """Stochastic simulation: the iteration time of every sampled run (sorted); None when deterministic."""
    plan: Plan | None = None
    """The stages or burst plan simulated (its ``strategy`` is then the schedule-level view: pp = stages, dp = 1;
    one stage for a burst plan)."""

    # ------------------------------------------------------------------------------------------------ metrics
    @property
    def iteration_time_s(self) -> float:
        """The iteration time; with stochastic simulation the median over the sampled runs."""
        if self.sampled_iteration_s:
            return float(np.median(self.sampled_iteration_s))
        return self._stats[0]

    @cached_property
    def timeline(self) -> Timeline:
        """The simulated GPUs' timeline (built when first asked for: a grid search needs only the metrics)."""
        return from_flow(self.flow, self.tasks.start_s, self.tasks.end_s)

    @cached_property
    def _stats(self) -> tuple[float, GPUStatsTable]:
        return metrics.flow_stats(self.flow, self.tasks.start_s, self.tasks.end_s)

    @property
    def num_gpus(self) -> int:
        """GPUs the iteration runs on."""
        return sum(len(v) for v in self.flow.represents.values())

    @property
    def global_batch_size(self) -> int:
        return self.plan.global_batch_size if self.plan is not None else self.strategy.global_batch_size

    @property
    def label(self) -> str:
        """The strategy (``2M4P2D``) or the plan in DAPPLE's notation (``15:1 split 13:11``)."""
        return self.plan.notation() if self.plan is not None else str(self.strategy)

    @property
    def throughput_samples_per_s(self) -> float:
        t = self.iteration_time_s
        return self.global_batch_size / t if t > 0 else float("inf")

    @property
    def throughput_tokens_per_s(self) -> float | None:
        if self.model.seq_len is None:
            return None
        return self.throughput_samples_per_s * self.model.seq_len

    @property
    def per_gpu(self) -> GPUStatsTable:
        """Busy compute, communication, exposed communication and idle seconds of every GPU (from the flow's arrays:
        :func:`distsim.sim.metrics.flow_stats`, equal to :func:`distsim.sim.metrics.gpu_stats` of the timeline), in
        GPU order: a sequence of :class:`~distsim.sim.metrics.GPUStats` kept per simulated GPU, so that 131,072
        GPUs cost no more than the 16 simulated ones until each is asked for."""
        return self._stats[1]

    @property
    def bubble_fraction(self) -> float:
        """Mean idle share of the iteration (:func:`distsim.sim.metrics.bubble_fraction`)."""
        return metrics.bubble_fraction(self.per_gpu, self.iteration_time_s)

    @property
    def exposed_comm_s(self) -> float:
        """Mean over GPUs of the communication time not hidden behind compute."""
        return metrics.mean_exposed_comm(self.per_gpu)

    @property
    def peak_memory_bytes(self) -> float:
        return max(m.total_bytes for m in self.memory)

    @property
    def fits_in_memory(self) -> bool:
        return all(m.fits for m in self.memory)

    @property
    def events_total(self) -> int:
        return self.flow.events_total

    @property
    def events_unique(self) -> int:
        return self.flow.events_unique

    def cost_table(self) -> pd.DataFrame:
        """Every distinct event: key, kind, seconds and source (given, measured, fitted, scaled, analytic)."""
        import pandas as pd  # here, when a table is asked for: importing pandas takes a tenth of a second

        f = self.flow
        return pd.DataFrame(
            {
                "event": f.keys,
                "kind": f.key_kinds,
                "seconds": [c.seconds for c in f.key_costs],
                "source": [c.source for c in f.key_costs],
            }
        )

    def source_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for c in self.flow.key_costs:
            counts[c.source] = counts.get(c.source, 0) + 1
        return counts

    def full_timeline(self) -> Timeline:
        """The timeline with rows for every GPU (expands symmetric simulations)."""
        return self.timeline.expand()

    def to_dict(self) -> dict[str, Any]:
        s = self.strategy
        return {
            "model": self.model.name,
            "cluster": self.cluster.name,
            "strategy": self.label,
            "strategy_detail": s.describe() if self.plan is None else self.plan.detail(),
            "gpus": self.num_gpus,
            "global_batch_size": self.global_batch_size,
            "iteration_time_s": self.iteration_time_s,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "throughput_tokens_per_s": self.throughput_tokens_per_s,
            "bubble_fraction": self.bubble_fraction,
            "exposed_comm_s": self.exposed_comm_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_capacity_bytes": self.cluster.gpu.memory_bytes,
            "fits_in_memory": self.fits_in_memory,
            "memory_per_rank": [m.to_dict() for m in self.memory],
            "events_total": self.events_total,
            "events_unique": self.events_unique,
            "event_sources": self.source_counts(),
            "estimated_events": [
                k for k, c in zip(self.flow.keys, self.flow.key_costs, strict=True) if c.source == "analytic"
            ]
            if self.cost_source == "profile"
            else [],
            "cost_source": self.cost_source,
            "symmetric": self.flow.symmetric,
            "simulated_gpus": len(self.flow.represents),
            "stage_layers": [end - start for start, end in self.flow.stage_ranges],
            "simulation_wall_time_s": self.wall_time_s,
            "samples": len(self.sampled_iteration_s) if self.sampled_iteration_s else 0,
            "iteration_time_p10_s": float(np.percentile(self.sampled_iteration_s, 10))
            if self.sampled_iteration_s
            else None,
            "iteration_time_p90_s": float(np.percentile(self.sampled_iteration_s, 90))
            if self.sampled_iteration_s
            else None,
            "per_gpu": self.per_gpu.to_dicts(),
        }
