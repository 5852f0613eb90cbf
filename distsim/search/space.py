"""The strategy space for N GPUs: every tensor x pipeline x data degree, micro-batch size and schedule.

``enumerate_strategies`` returns the valid strategies and, for every combination it skips, the reason (DistSim's
grid search, Sec. 6: on 16 GPUs MP and PP range over the divisors and DP = 16 / (MP x PP), 15 settings).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from distsim.core.cluster import Cluster
from distsim.core.errors import DistsimError, ScheduleError, StrategyError
from distsim.core.models.graph import Model
from distsim.core.schedules import check_schedule_size
from distsim.core.strategy import Strategy, check_strategy


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


def cluster_for(cluster: Cluster, gpus: int | None) -> Cluster:
    """The first `gpus` GPUs of the cluster (whole nodes); None: all of them."""
    if gpus is None:
        return cluster
    if gpus < 1:
        raise DistsimError(f"the GPU count must be positive, got {gpus}")
    if gpus > cluster.num_gpus:
        nodes = -(-gpus // cluster.gpus_per_node)
        raise DistsimError(
            f"cluster {cluster.name} has {cluster.num_gpus} GPUs ({cluster.nodes} nodes x {cluster.gpus_per_node}), "
            f"not {gpus}; pass --nodes {nodes} to describe a larger one"
        )
    if gpus % cluster.gpus_per_node:
        raise DistsimError(
            f"{gpus} GPUs is not a whole number of {cluster.name} nodes ({cluster.gpus_per_node} GPUs each)"
        )
    return cluster if gpus == cluster.num_gpus else cluster.with_nodes(gpus // cluster.gpus_per_node)


def enumerate_strategies(
    model: Model,
    cluster: Cluster,
    gpus: int,
    global_batch: int,
    micro_batch_sizes: Iterable[int] = (1,),
    schedules: Iterable[str] = ("1f1b",),
    virtual_stages: int = 2,
    grad_sync: str = "bulk",
    tp_degrees: Iterable[int] | None = None,
    pp_degrees: Iterable[int] | None = None,
    even_stages: bool = True,
) -> tuple[list[Strategy], list[Skipped]]:
    """Valid strategies for exactly `gpus` GPUs at a fixed global batch, and the skipped combinations with reasons.

    `tp_degrees` / `pp_degrees` restrict the degrees tried (default: every divisor). With `even_stages` a model
    that declares ``pipeline_layers`` (its transformer layer count) only gets pipeline degrees that divide it (times
    the virtual stages when interleaved), as Megatron-LM requires.
    """
    if global_batch < 1:
        raise DistsimError(f"the global batch must be positive, got {global_batch}")
    cluster = cluster_for(cluster, gpus)
    valid: list[Strategy] = []
    skipped: list[Skipped] = []
    schedules = list(dict.fromkeys(schedules))
    tps = set(tp_degrees) if tp_degrees is not None else None
    pps = set(pp_degrees) if pp_degrees is not None else None
    for tp in divisors(gpus):
        if tps is not None and tp not in tps:
            continue
        for pp in divisors(gpus // tp):
            if pps is not None and pp not in pps:
                continue
            dp = gpus // (tp * pp)
            for mbs in micro_batch_sizes:
                for i, schedule in enumerate(schedules):
                    if pp == 1 and i > 0 and schedule != "interleaved":
                        skipped.append(Skipped(tp, pp, dp, mbs, schedule, f"same as {schedules[0]}: no pipeline"))
                        continue
                    made = _make(model, cluster, global_batch, tp, pp, dp, mbs, schedule, virtual_stages, grad_sync)
                    units = model.pipeline_layers
                    if even_stages and units and isinstance(made, Strategy) and pp > 1 and units % made.num_stages:
                        what = f"pp x v = {pp} x {made.chunks}" if made.chunks > 1 else f"pp={pp}"
                        made = f"{what} does not divide the {units} transformer layers (Megatron-LM needs equal stages)"
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
        check_schedule_size(strategy.num_micro_batches, strategy.num_stages)
    except (StrategyError, ScheduleError) as exc:
        return str(exc)
    return strategy
