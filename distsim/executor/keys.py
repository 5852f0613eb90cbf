"""What a measured row says of its event beyond its times: the :data:`distsim.sim.timeline.COMM_COLUMNS` (``key``,
``bytes``, ``peer``, ``group``) of one executor rank's events.

``bytes``, ``peer`` and ``group`` are what the rank handed to ``torch.distributed``: the bytes of the tensors a
communication moved (numel x element size; a transfer's payload, without the shape header its first transfer
sends), the other rank of a point-to-point transfer, and the ranks of the group it ran over ("0-3, 8-11").

``key`` is the event key the simulator costs the same event by (:class:`~distsim.sim.costs.ComputeEvent` and
:class:`~distsim.sim.costs.CommEvent` keys, :func:`~distsim.sim.costs.optimizer_key`), so that a measured row joins
``SimResult.cost_table()``'s ``event``. :class:`EventKeys` derives it from the plan the way
:mod:`distsim.sim.flow.uniform` does (the block and its shape, the micro-batch size, the tensor-parallel degree and
dtype; a collective's bytes, group size, scope and NIC sharers from the same :class:`~distsim.core.placement.Placement`
under the default ``--link-sharing structural``). So the key's ``bytes=`` is the simulator's figure for the event,
which can differ from the ``bytes`` column (what the rank really moved; a ZeRO-1 bucket padded to the group size).
Rows without a key (``""``): host launch rows, a burst plan's rows, and data-parallel buckets of a model whose
parameter tensors are not the ones the simulator describes (its buckets are then not the simulator's).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from distsim.core.partition import rank_layers
from distsim.core.sync import SHARDINGS, Bucket
from distsim.sim.costs import CommEvent, ComputeEvent, optimizer_key
from distsim.sim.timeline import format_ranges

Info = tuple[str, int, int, str]
"""(key, bytes, peer, group) of one row (:data:`distsim.sim.timeline.COMM_COLUMNS`)."""
NO_INFO: Info = ("", 0, -1, "")
"""A row that says nothing beyond its times: no key, no bytes, no peer, no group (compute rows but for the key)."""


def group_text(ranks: Any) -> str:
    """The ranks of a group as the simulated timeline writes them ("0-3, 8-11")."""
    return format_ranges(tuple(int(r) for r in ranks))


def nbytes(*tensors: Any) -> int:
    """Bytes of the tensors handed to a collective or transfer."""
    return sum(int(t.numel()) * int(t.element_size()) for t in tensors)


class EventKeys:
    """The simulator's event keys of one rank's events (pipeline rank `pipe_rank`, replica `replica`, tp rank
    `tp_rank`) under `strategy` on `placement`. `sim_buckets`: whether the rank's gradient buckets are the
    simulator's (its parameter tensors are the model's): else data-parallel buckets get no key."""

    def __init__(self, model: Any, strategy: Any, placement: Any, stage_ranges: Any, coords: tuple[int, int, int],
                 sim_buckets: bool = True) -> None:  # fmt: skip
        self.model, self.strategy, self.placement, self.stage_ranges = model, strategy, placement, stage_ranges
        self.pipe_rank, self.replica, self.tp_rank = coords
        self.sim_buckets = sim_buckets
        self.mbs, self.tp, self.dtype = strategy.micro_batch_size, strategy.tp, model.precision.name
        self._blocks: dict[tuple[int, str], Any] = {}
        self._known: dict[tuple[str, str, str, int], str] = {}  # (what, kind, name, layer) -> key: every iteration

    # ------------------------------------------------------------------------------------------------ compute
    def block(self, layer: int, name: str) -> Any:
        """The block a compute row of `layer` named `name` ran (rows name blocks as the simulator does)."""
        found = self._blocks.get((layer, name))
        if found is None:
            blocks = self.model.layers[layer].blocks
            if len(blocks) == 1:
                found = blocks[0]
            else:
                found = next((b for b in blocks if f"{self.model.layers[layer].name}.{b.op}" == name), None)
            self._blocks[(layer, name)] = found
        return found

    def compute(self, kind: str, name: str, layer: int) -> str:
        """A block's forward (or recomputed forward: the same event) or backward."""
        known = self._known.get(("compute", kind, name, layer))
        if known is None:
            block = self.block(layer, name) if layer >= 0 else None
            phase = "B" if kind == "backward" else "F"
            known = "" if block is None else ComputeEvent(block, phase, self.mbs, self.tp, self.dtype).key
            self._known[("compute", kind, name, layer)] = known
        return known

    def tp_allreduce(self, kind: str, name: str, layer: int) -> str:
        """The tensor-parallel all-reduce of a block in the phase of `kind` (Megatron's g in forward, f in
        backward), of the bytes per sample the model gives it."""
        known = self._known.get(("tp", kind, name, layer))
        if known is None:
            block = self.block(layer, name) if layer >= 0 and self.tp > 1 else None
            known = ""
            if block is not None:
                per_sample = block.tp_bwd_allreduce_bytes if kind == "backward" else block.tp_fwd_allreduce_bytes
                inst = self.placement.tp_groups(self.pipe_rank)[self.replica]
                known = CommEvent("all_reduce", round(per_sample * self.mbs), self.tp, inst.scope, inst.sharers).key
            self._known[("tp", kind, name, layer)] = known
        return known

    @cached_property
    def optimizer(self) -> str:
        """The rank's optimizer step: its tp shard's parameters (1/dp of them with a sharded optimizer)."""
        share = self.strategy.dp if SHARDINGS[self.strategy.optimizer_sharding].divides_step else 1
        layers = sorted(rank_layers(self.stage_ranges, self.strategy.pp, self.pipe_rank))
        params = self.model.rank_params(layers, self.tp) / share
        return optimizer_key(params, self.model.precision.state_bytes_per_param)

    # ----------------------------------------------------------------------------------------- communication
    def _pair(self, src_rank: int, dst_rank: int) -> Any:
        """This rank's coordinate's instance of the transfers from pipeline rank `src_rank` to `dst_rank`."""
        return self.placement.p2p_pairs(src_rank, dst_rank)[self.replica * self.tp + self.tp_rank]

    def p2p(self, src_vs: int, dst_vs: int) -> str:
        """An activation (forward) or gradient (backward) transfer between two virtual stages."""
        known = self._known.get(("p2p", "", str(src_vs), dst_vs))
        if known is None:
            cut = self.stage_ranges[min(src_vs, dst_vs)][1] - 1
            inst = self._pair(src_vs % self.strategy.pp, dst_vs % self.strategy.pp)
            size = round(self.model.boundary_bytes[cut] * self.mbs)
            known = CommEvent("p2p", size, 2, inst.scope, inst.sharers).key
            self._known[("p2p", "", str(src_vs), dst_vs)] = known
        return known

    def _dp(self, collective: str, size: int) -> str:
        if not self.sim_buckets:
            return ""
        inst = self.placement.dp_groups(self.pipe_rank)[self.tp_rank]
        return CommEvent(collective, size, len(inst.gpus), inst.scope, inst.sharers).key

    def bucket(self, bucket: Bucket) -> str:
        """A gradient bucket's all-reduce (reduce-scatter with a sharded optimizer)."""
        return self._dp(SHARDINGS[self.strategy.optimizer_sharding].gradients, bucket.nbytes)

    def gather(self, bucket: Bucket) -> str:
        """ZeRO's all-gather of a bucket's parameters after the step."""
        precision = self.model.precision
        return self._dp("all_gather", round(bucket.nbytes * precision.param_bytes / precision.grad_bytes))

    def tied(self, layer: int, target: int) -> str:
        """The all-reduce of a tied layer's copy with its original's, over the pair of their pipeline ranks."""
        rank_of = {li: r for r in range(self.strategy.pp) for li in rank_layers(self.stage_ranges, self.strategy.pp, r)}
        size = round(self.model.layers[layer].tied_shard_params(self.tp) * self.model.precision.grad_bytes)
        inst = self._pair(rank_of[target], rank_of[layer])
        return CommEvent("all_reduce", size, 2, inst.scope, inst.sharers).key
