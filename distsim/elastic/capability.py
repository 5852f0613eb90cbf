"""A job's capability on a GPU type, from the cost source: the C_i of EasyScale's planner (ALGORITHMS.md 5.2).

C_i is the mini-batches per second one GPU of type i runs for this job: here 1 / (the simulated iteration of a
single-GPU job of the model at its micro-batch size on that GPU), as ``distsim simulate --strategy 1M1P1D`` on a
one-GPU cluster (:func:`distsim.search.collocate.background_iteration`). That iteration includes the optimizer step,
which EasyScale runs once per global step rather than once per EST mini-batch, so C_i is slightly low for jobs
whose update is a large share of a mini-batch. EasyScale itself fills its database from measured throughput.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from distsim.core.cluster import GPU, PCIE4, Cluster, Link, gpu_type
from distsim.core.models.graph import Model
from distsim.sim.costs import AnalyticCosts, CostSource


@dataclass(frozen=True)
class Capability:
    """One GPU type's capability for a job: C_i and where it comes from."""

    gpu_type: str
    per_s: float  # C_i: mini-batches per second
    iteration_s: float | None  # the simulated single-GPU iteration, None when given by the user
    peak_memory_bytes: float | None
    memory_bytes: float | None  # the GPU's memory
    source: str

    @property
    def fits(self) -> bool:
        """One EST's peak memory fits in the GPU (unknown: assumed to)."""
        peak, memory = self.peak_memory_bytes, self.memory_bytes
        return peak is None or memory is None or peak <= memory

    def to_dict(self) -> dict[str, object]:
        return {"gpu_type": self.gpu_type, "per_s": self.per_s, "iteration_s": self.iteration_s,
                "peak_memory_bytes": self.peak_memory_bytes, "memory_bytes": self.memory_bytes, "fits": self.fits,
                "source": self.source}  # fmt: skip


def single_gpu_cluster(gpu: GPU | Cluster | str) -> Cluster:
    """One GPU alone (a type name such as 'T4', a GPU, or a cluster whose GPU it takes); its links are never used."""
    if isinstance(gpu, Cluster):
        from distsim.search.collocate import one_gpu

        return one_gpu(gpu)
    if isinstance(gpu, str):
        gpu = gpu_type(gpu)[1]
    return Cluster(f"1x {gpu.name}", 1, 1, gpu, PCIE4, Link(PCIE4.bandwidth_bytes_per_s, PCIE4.latency_s), 1,
                   source="one GPU alone (EasyScale capability)")  # fmt: skip


def measure(model: Model, gpu: GPU | Cluster | str, micro_batch_size: int,
            costs: CostSource | None = None) -> Capability:  # fmt: skip
    """The capability of one GPU (a type name, a GPU or a cluster's GPU) for `model` at `micro_batch_size` samples
    per mini-batch, simulated with `costs` (default: the analytic model of that GPU)."""
    from distsim.search.collocate import background_iteration

    cluster = single_gpu_cluster(gpu)
    costs = costs if costs is not None else AnalyticCosts(cluster)
    r = background_iteration(model, cluster, micro_batch_size, costs)
    name = gpu_type(gpu)[0] if isinstance(gpu, str) else cluster.gpu.name
    source = f"simulated single-GPU iteration of {model.name} at batch {micro_batch_size} on {cluster.gpu.name}"
    return Capability(name, 1.0 / r.iteration_time_s, r.iteration_time_s, r.peak_memory_bytes,
                      cluster.gpu.memory_bytes, f"{source} ({costs.name})")  # fmt: skip


def capability(model: Model, gpu: GPU | Cluster | str, micro_batch_size: int, costs: CostSource | None = None) -> float:
    """C_i: mini-batches per second of `model` at `micro_batch_size` on one GPU = 1 / its simulated iteration."""
    return measure(model, gpu, micro_batch_size, costs).per_s


def capabilities(model: Model, types: Iterable[str], micro_batch_size: int) -> dict[str, Capability]:
    """Each named GPU type's capability (canonical names, e.g. 'v100' -> 'V100'), from the analytic model."""
    out: dict[str, Capability] = {}
    for t in types:
        c = measure(model, t, micro_batch_size)
        out[c.gpu_type] = c
    return out
