"""The strategy space for N GPUs: every tensor x pipeline x data degree, micro-batch size and schedule.

``enumerate_strategies`` returns the valid strategies and, for every combination it skips, the reason (DistSim's
grid search, Sec. 6: on 16 GPUs MP and PP range over the divisors and DP = 16 / (MP x PP), 15 settings).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from distsim.cluster import Cluster
from distsim.errors import DistsimError, StrategyError
from distsim.models.graph import Model
from distsim.strategy import Strategy, check_strategy


@dataclass(frozen=True)
class Skipped:
    tp: int
    pp: int
    dp: int
    micro_batch_size: int
    schedule: str
    reason: str

    def __str__(self) -> str:
        return f"{self.tp}M{self.pp}P{self.dp}D mbs={self.micro_batch_size} {self.schedule}: {self.reason}"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def cluster_for(cluster: Cluster, gpus: int) -> Cluster:
    """The cluster resized to `gpus` GPUs (whole nodes)."""
    if gpus % cluster.gpus_per_node:
        raise DistsimError(
            f"{gpus} GPUs is not a whole number of {cluster.name} nodes ({cluster.gpus_per_node} GPUs each)"
        )
    return cluster.with_nodes(gpus // cluster.gpus_per_node)


def enumerate_strategies(
    model: Model,
    cluster: Cluster,
    gpus: int,
    global_batch: int,
    micro_batch_sizes: Iterable[int] = (1,),
    schedules: Iterable[str] = ("1f1b",),
    virtual_stages: int = 2,
    grad_sync: str = "bulk",
) -> tuple[list[Strategy], list[Skipped]]:
    """Valid strategies for exactly `gpus` GPUs at a fixed global batch, and the skipped combinations with reasons."""
    cluster = cluster_for(cluster, gpus)
    valid: list[Strategy] = []
    skipped: list[Skipped] = []
    schedules = list(schedules)
    for tp in divisors(gpus):
        for pp in divisors(gpus // tp):
            dp = gpus // (tp * pp)
            for mbs in micro_batch_sizes:
                for i, schedule in enumerate(schedules):
                    if pp == 1 and i > 0 and schedule != "interleaved":
                        skipped.append(Skipped(tp, pp, dp, mbs, schedule, f"same as {schedules[0]}: no pipeline"))
                        continue
                    made = _make(model, cluster, global_batch, tp, pp, dp, mbs, schedule, virtual_stages, grad_sync)
                    if isinstance(made, str):
                        skipped.append(Skipped(tp, pp, dp, mbs, schedule, made))
                    else:
                        valid.append(made)
    return valid, skipped


def _make(
    model: Model,
    cluster: Cluster,
    global_batch: int,
    tp: int,
    pp: int,
    dp: int,
    mbs: int,
    schedule: str,
    virtual_stages: int,
    grad_sync: str,
) -> Strategy | str:
    """The strategy, or why it is not valid."""
    if global_batch % (dp * mbs):
        return f"global batch {global_batch} is not divisible by dp x mbs = {dp} x {mbs}"
    extra = {"virtual_stages": virtual_stages} if schedule == "interleaved" else {}
    try:
        strategy = Strategy(tp=tp, pp=pp, dp=dp, micro_batch_size=mbs, num_micro_batches=global_batch // (dp * mbs),
                            schedule=schedule, grad_sync=grad_sync, **extra)  # fmt: skip
        check_strategy(strategy, model, cluster)
    except StrategyError as exc:
        return str(exc)
    return strategy
