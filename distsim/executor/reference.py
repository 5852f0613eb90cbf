"""The single-process reference a distributed run must reproduce: the same model, data and global batch on one rank.

It runs the executor's own runtime with a 1-GPU plan whose micro-batches are all dp x M micro-batches of the
distributed plan, in the same sample order, so the loss and the gradients (before the optimizer step) are those the
tensor-, pipeline- and data-parallel mechanics must reproduce.
"""

from __future__ import annotations

from typing import Any

import torch

from distsim.core.cluster import Cluster
from distsim.core.models.graph import Model
from distsim.core.partition import ranges
from distsim.core.placement import Placement
from distsim.core.schedules import build_schedule
from distsim.core.strategy import Strategy
from distsim.executor.runtime import Runtime
from distsim.profiler.blocks import torch_dtype


def reference_step(model: Model, cluster: Cluster, strategy: Strategy, seed: int = 0) -> dict[str, Any]:
    """Loss and full gradients of iteration 0 of `strategy`'s global batch, and the parameters after its Adam step,
    computed by one process (without recomputation or a sharded optimizer: what they must reproduce)."""
    single = Strategy(micro_batch_size=strategy.micro_batch_size,
                      num_micro_batches=strategy.dp * strategy.num_micro_batches,
                      partition=(model.num_layers,))  # fmt: skip
    one = cluster.with_nodes(1).__class__(**{**cluster.__dict__, "nodes": 1, "gpus_per_node": 1, "slowdown": ()})
    device = torch.device("cpu")
    runtime = Runtime(model, single, Placement(single, one), build_schedule(single), ranges(single.partition or ()),
                      0, {}, torch_dtype(model.precision.name, device), device, seed)  # fmt: skip
    captured: dict[str, Any] = {}

    def capture() -> None:
        captured["grads"] = {
            f"L{li}.B{bi}.{name}": p.grad.detach().clone()
            for (li, bi), module in runtime.modules.items()
            for name, p in module.named_parameters()
            if p.grad is not None
        }
        captured["loss"] = sum(runtime.losses) / len(runtime.losses)
        captured["losses"] = list(runtime.losses)

    def capture_params() -> None:
        captured["params"] = {
            f"L{li}.B{bi}.{name}": p.detach().clone()
            for (li, bi), module in runtime.modules.items()
            for name, p in module.named_parameters()
        }

    runtime.run_iteration(0, lambda: None, before_step=capture, after_step=capture_params)
    return captured
