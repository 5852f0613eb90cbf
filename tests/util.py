"""Builders for hand-checkable cases: a cluster with round numbers and models with given layer times."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from distsim.cli import main
from distsim.core.cluster import GPU, Cluster, Link
from distsim.core.models import Model, model_from_dict
from distsim.sim.costs import AnalyticCosts, ComputeEvent, Cost

# Links move 1000 bytes/s with no latency, so bytes/1000 is the transfer time; compute times are given by the model;
# memory bandwidth is so high that the optimizer step costs ~1e-27 s.
HAND_GPU = GPU(
    "unit",
    peak_flops_per_s=1e12,
    memory_bytes=1e12,
    memory_bandwidth_bytes_per_s=1e30,
    compute_efficiency=1.0,
    kernel_overhead_s=0.0,
)


def hand_cluster(
    nodes: int = 1,
    gpus_per_node: int = 8,
    intra_bw: float = 1000.0,
    inter_bw: float = 1000.0,
    intra_lat: float = 0.0,
    inter_lat: float = 0.0,
    nics: int = 1,
) -> Cluster:
    return Cluster("hand", nodes, gpus_per_node, HAND_GPU, Link(intra_bw, intra_lat), Link(inter_bw, inter_lat), nics)


def chain_model(layers: list[tuple[float, float, int, float]], name: str = "hand") -> Model:
    """Layers as (forward_s, backward_s, params, out_bytes); fp16 so gradients are 2 bytes per parameter."""
    spec: list[dict[str, Any]] = [
        {"name": f"l{i}", "forward_s": f, "backward_s": b, "params": p, "out_bytes": o}
        for i, (f, b, p, o) in enumerate(layers)
    ]
    return model_from_dict({"name": name, "layers": spec})


@dataclass
class InterferingCosts(AnalyticCosts):
    """Analytic costs plus measured-style interference of overlapped communication (compute and comm slowdowns
    of intra-node overlap, then of inter-node overlap)."""

    slowdowns: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    launch_s: float = 0.0
    """Host seconds to enqueue every compute event (a measured-style launch cost); 0: the analytic one."""

    def interference(self, scope: str) -> tuple[float, float]:
        c_intra, k_intra, c_inter, k_inter = self.slowdowns
        return (c_intra, k_intra) if scope == "intra" else (c_inter, k_inter)

    def compute(self, event: ComputeEvent) -> Cost:
        cost = super().compute(event)
        return replace(cost, launch_s=self.launch_s) if self.launch_s else cost


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the command line in-process: (exit status, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err
