"""Event flow: the task DAG of one training iteration, built hierarchically as in DistSim Sec. 4.3.

1. **Tensor (model) parallelism** maps every block of a layer to a compute event followed, when tp > 1, by an
   all-reduce over the tp group (forward and backward), or with sequence parallelism surrounded by an all-gather and
   a reduce-scatter; activation recomputation then rewrites a layer's backward: :mod:`distsim.sim.flow.templates`.
2. **Pipeline parallelism** walks the schedule (DistSim Algorithm 1): each (stage, F/B, micro-batch) action expands
   to its stage's events; a forward waits for the previous stage's activation transfer, a backward for the next
   stage's gradient transfer; after an action the result is sent to the neighbour. A send is *non-blocking* by
   default (a pure delay on the sender's p2p stream) or, with ``p2p_blocking``, occupies the sender's compute stream
   as Algorithm 1 puts it in the device's event list.
3. **Data parallelism** replicates the pipeline and adds gradient synchronisation: one bulk all-reduce of the
   stage's gradients after the last backward (DistSim), or one all-reduce per layer issued as soon as that layer's
   last backward finishes and overlapped with the rest of backward (WFBP), or gradient buckets as the modes of
   :mod:`distsim.core.sync` lower them, reduce-scattered instead with a sharded optimizer (ZeRO). The optimizer step
   follows, and with ZeRO the parameters' all-gathers (after the step, or before each layer's forward and backward).

Every task occupies one or more *slots*, an in-order stream of one GPU, like a CUDA stream; a collective is one task
on all its members, so it starts when every member is ready. Tasks are emitted in a global topological order (the
unit-time order of the schedule), and each stream serves its tasks in that order, so every wait points to an earlier
task: the flow cannot deadlock, and with fixed orders the iteration time is a max-plus function of the durations
(more bandwidth or faster compute never makes it longer).

**Link sharing.** ``structural`` (default): communication runs on the ``tp``, ``p2p`` and ``dp`` streams and shares
links only as the cost model says (k symmetric flows leaving a node at once split its NICs); traffic of different
kinds overlaps freely, an optimistic bound. ``serialize``: all communication of one scope on a GPU (a p2p transfer on
both its ends) goes through one in-order queue per link class, ``link:intra`` and ``link:inter``, in emission order:
p2p and collective traffic take turns on the link, a pessimistic bound. ``fair``: every communication task that
crosses nodes, of any pattern, is costed as if alone and recorded as a *network task* (:attr:`EventFlow.network`: the
nodes whose NICs it sends and receives through, its bytes on the wire, its latency part); the engine
(:func:`distsim.sim.network.run_shared`) divides each node's NICs equally among the network tasks using them at each
moment (processor sharing), so transfers slow each other while, and only while, they overlap. Intra-node links stay
as the cost model prices them. First-come arbitration is deliberately not offered: it admits Graham-type anomalies
where faster compute slows the iteration; processor sharing admits them too (a transfer that starts earlier can
overlap a critical one), so ``fair`` is not guaranteed monotone.

**Overlap interference.** Communication that overlaps compute on the same GPU is not free: on CPUs the rank's
cores run the TCP stack and the reductions, on GPUs NCCL kernels take SMs. A profile measures, per scope, how much
compute slows while an all-reduce runs (c) and how much the all-reduce slows while compute runs (k). Overlappable
transfers (a WFBP layer all-reduce other than a rank's last, a non-blocking send) then take (1 + k) times as long
and put a *shadow* task of c / (1 + c) of that time on their GPUs' compute streams, in emission order: where compute
is running it is delayed by that share, where the stream idles it costs nothing. Without measurements c = k = 0.

**Symmetry.** Replicas and tensor-parallel peers of a pipeline rank do identical work when their GPUs are equally
fast and every instance of each communication has the same scope and NIC sharing. Then one GPU per pipeline rank is
simulated and stands for the tp x dp GPUs of that rank; otherwise every GPU is simulated. With ``fair`` sharing a
simulated network task also stands for the identical instances of its pattern beside it (each node's NICs carry
them all: :attr:`distsim.sim.network.NetUse.usage` counts them), which is exact when every instance sees the same
load (:func:`distsim.core.placement.shares_evenly`); where that does not hold every GPU is simulated.

This module holds the flow's types; :mod:`distsim.sim.flow.templates` builds the tensor-parallel level (stage
templates),
:mod:`distsim.sim.flow.uniform` the flow of a strategy (pipeline and data-parallel levels),
:mod:`distsim.plans.stages_flow`
the flow of a stages plan, and :mod:`distsim.sim.flow.comm` places the communication both emit.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, MutableSequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from distsim.core.cluster import Cluster
from distsim.core.models.graph import Model
from distsim.core.partition import balanced_partition, ranges
from distsim.core.placement import Placement
from distsim.core.schedules import Schedule
from distsim.core.strategy import Strategy
from distsim.sim.costs import ComputeEvent, Cost, CostSource
from distsim.sim.engine import PREV, ChainRelease, Releases, _Prev, expand_releases
from distsim.sim.flow.chain import ActionBlock, Chain
from distsim.sim.network import NetUse

STREAMS = ("compute", "tp", "p2p", "dp", "link:intra", "link:inter", "host", "gather")
KINDS = ("forward", "backward", "tp_allreduce", "p2p", "dp_allreduce", "optimizer", "interference", "launch",
         "recompute", "ep_alltoall", "cp_ring")  # fmt: skip
COMPUTE_KINDS = frozenset({"forward", "backward", "optimizer", "recompute"})
S_COMPUTE, S_TP, S_P2P, S_DP, S_LINK_INTRA, S_LINK_INTER, S_HOST, S_GATHER = range(8)
"""S_GATHER: the parameter all-gathers of a sharded optimizer (ZeRO), on a stream of their own as FSDP runs them
beside the gradient reduce-scatters."""
LINK_SHARING = ("structural", "serialize", "fair")
K_FWD, K_BWD, K_TP, K_P2P, K_DP, K_OPT, K_SHADOW, K_LAUNCH, K_RECOMPUTE, K_EP, K_CP = range(11)
"""K_TP: a collective over the tensor-parallel group (an all-reduce; a reduce-scatter or all-gather with sequence
parallelism); K_DP: one over the data-parallel group (a gradient all-reduce or reduce-scatter, a tied copies'
all-reduce, a ZeRO parameter all-gather). The kinds keep their historical names (``tp_allreduce``, ``dp_allreduce``);
the event key names the collective.
K_SHADOW: compute-stream time taken by overlapped communication (measured interference); not a timeline row.
K_LAUNCH: the host enqueuing kernels (the ``host`` stream); a timeline row, but neither compute nor communication.
K_RECOMPUTE: a forward run again in backward (activation recomputation); compute.
K_EP: an all-to-all over an expert-parallel group (a mixture-of-experts layer's token dispatch or combine); it runs
on the ``tp`` stream, the stream of the model-parallel collectives a layer waits for.
K_CP: the exposed part of ring attention's key/value passes around a context-parallel group (on the ``tp`` stream)."""


@dataclass(frozen=True)
class FlowOptions:
    p2p_blocking: bool = False
    """True: a send occupies the sender's compute stream (DistSim Algorithm 1); False: a pure delay on a p2p stream."""
    symmetric: bool | None = None
    """None: exploit symmetry when it holds; False: simulate every GPU; True: require symmetry."""
    rank_order: str = "tp,dp,pp"
    """Rank placement, innermost dimension first (Megatron-LM: tensor, then data, then pipeline)."""
    link_sharing: str = "structural"
    """``structural``: traffic kinds overlap, NIC shares from the structure; ``serialize``: one queue per link;
    ``fair``: inter-node traffic of any kind shares each node's NICs equally while it overlaps (a SimPy engine)."""
    host: bool | None = None
    """Model each GPU's host enqueuing its kernels (a ``host`` stream; a kernel starts no earlier than its launch).
    None: when kernels cost host time to launch (the cluster's GPU has a launch cost, or the profile measured one)."""
    exact_host: bool = False
    """Keep every launch constraint. By default one that the previous kernel of a chain already implies (it runs at
    least as long as this kernel's launch) is left out, which keeps large models' flows small; stochastic runs, whose
    durations vary, keep them all."""

    def __post_init__(self) -> None:
        if self.link_sharing not in LINK_SHARING:
            from distsim.core.errors import DistsimError

            raise DistsimError(f"link sharing must be one of {', '.join(LINK_SHARING)}, got {self.link_sharing!r}")


CompactReleases = dict[int, list[tuple[int, float] | ChainRelease] | Releases]
"""Host task -> its launch constraints as the builders store them (:attr:`EventFlow.releases` expands them)."""


@dataclass
class EventFlow:
    """Tasks as parallel columns (index = task id) plus what the engine and the timeline need."""

    model: Model
    cluster: Cluster
    strategy: Strategy
    schedule: Schedule
    placement: Placement | None
    """Rank placement of a uniform strategy; None for a stages plan (its stages list their devices)."""
    stage_ranges: tuple[tuple[int, int], ...]
    symmetric: bool
    represents: dict[int, tuple[int, ...]]
    """Simulated GPU -> the GPUs it stands for (itself first)."""
    duration_s: MutableSequence[float] = field(default_factory=list)
    """Seconds each task takes. This and the other numeric columns (:attr:`kind`, :attr:`layer`, :attr:`stage`,
    :attr:`microbatch`, :attr:`key`) are arrays in a full (not symmetric) flow: it has millions of tasks, and an
    array holds a number in 1 to 8 bytes where a list takes 8 for the pointer and 32 for a float (numpy reads an
    array without a copy). A symmetric flow is small, and appending to a list takes a third of the time."""
    _deps: list[list[int] | _Prev | int] = field(default_factory=list, repr=False)
    """Each task's dependency list as built: :data:`~distsim.sim.engine.PREV` for a chain's op that waits for the
    op before it alone; an int d for a one-slot task that waits for d and for its slot's previous task, which is d
    or one of d's own dependencies, so d's end implies it (:meth:`add`; a full flow is mostly such tasks, and an int
    is a fifth of a list). :attr:`deps` expands both."""
    slots: list[tuple[tuple[int, int], ...]] = field(default_factory=list)
    """(gpu, stream) pairs each task occupies; a timeline row per slot."""
    slot_code: array[int] = field(default_factory=lambda: array("i"))
    """Each task's :attr:`slots` tuple as a number: the tuple's index in :attr:`slot_sets` (builders share one
    tuple per stream or group, so a flow has a few hundred; the per-GPU figures group tasks by it)."""
    slot_sets: list[tuple[tuple[int, int], ...]] = field(default_factory=list)
    """The distinct :attr:`slots` tuples, by identity, in the order first used."""
    kind: MutableSequence[int] = field(default_factory=bytearray)
    """Each task's kind (:data:`KINDS`), one byte each: numpy reads it without a copy."""
    name: list[str] = field(default_factory=list)
    layer: MutableSequence[int] = field(default_factory=list)
    stage: MutableSequence[int] = field(default_factory=list)
    microbatch: MutableSequence[int] = field(default_factory=list)
    key: MutableSequence[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    key_costs: list[Cost] = field(default_factory=list)
    key_kinds: list[str] = field(default_factory=list)
    _releases: CompactReleases = field(default_factory=dict, repr=False)
    """:attr:`releases` as built: a chain's constraints one :class:`~distsim.sim.engine.ChainRelease` each, and a
    host task's list of pairs alone as :class:`~distsim.sim.engine.Releases`."""
    members: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Communication task -> the GPUs of its instance (a transfer: sender, then receiver; a collective: its group,
    simulated or not). Tensor-, expert- and context-parallel ops of stage templates are not listed: their group
    follows from the placement (:func:`distsim.sim.timeline.from_flow`)."""
    network: dict[int, NetUse] = field(default_factory=dict)
    """Fair link sharing: network task -> how it uses the nodes' NICs; its duration is its cost alone (empty with
    the other modes: nothing is shared in time)."""
    costed: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False)
    """The stage templates' events costed so far (:mod:`distsim.sim.flow.templates`), shared by the flow's stages."""
    _same: dict[int, Any] = field(default_factory=dict, repr=False)
    """id of a model's block -> the first block equal to it (:meth:`same_block`); shared by the flows of one model
    inside :func:`shared_partitions` (a search)."""
    _blocks: dict[Any, Any] = field(default_factory=dict, repr=False)
    _last: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)
    _codes: dict[int, int] = field(default_factory=dict, repr=False)
    """id of a :attr:`slots` tuple (kept alive by the column) -> its :attr:`slot_code`."""
    _chain_codes: dict[int, array[int]] = field(default_factory=dict, repr=False)
    """id of a chain (kept alive by :attr:`_runs`) or action block (by :attr:`_keep`) added -> its slot codes."""
    _keep: list[Any] = field(default_factory=list, repr=False)
    _key_index: dict[str, int] = field(default_factory=dict, repr=False)
    _singles: bool = field(default=False, repr=False)
    """Whether :attr:`_deps` holds an int (:meth:`_expand_singles`)."""
    _runs: list[tuple[int, Chain]] = field(default_factory=list, repr=False)
    """(first task, chain) of every chain added, to expand the :data:`~distsim.sim.engine.PREV` of its ops."""
    _expanded: tuple[int, list[list[int]], dict[int, list[tuple[int, float]]]] | None = field(default=None,
                                                                                               repr=False)  # fmt: skip

    def __post_init__(self) -> None:
        self._same, self._blocks = memoised("same blocks", self.model, None, (), lambda: ({}, {}))
        if not self.symmetric and not self.duration_s:  # see duration_s
            self.duration_s, self.kind = array("d"), array("b")
            self.layer, self.stage, self.microbatch, self.key = array("i"), array("i"), array("i"), array("i")

    def __len__(self) -> int:
        return len(self.duration_s)

    @property
    def deps(self) -> list[list[int]]:
        """Each task's dependencies (task ids), expanded from the compact form the builders write (the engine reads
        that form directly: :func:`distsim.sim.engine.run`)."""
        return self._expand()[1]

    @property
    def releases(self) -> dict[int, list[tuple[int, float]]]:
        """Launch constraints: host task -> (task, offset): the task starts no earlier than `offset` seconds after
        the host task starts (its kernel is enqueued by then)."""
        return self._expand()[2]

    def _expand(self) -> tuple[int, list[list[int]], dict[int, list[tuple[int, float]]]]:
        """:attr:`deps` and :attr:`releases` as plain lists, computed when first read and again if tasks were added
        since."""
        if self._expanded is not None and self._expanded[0] == len(self._deps):  # release() clears it
            return self._expanded
        deps: list[Any] = list(self._deps)
        for tid0, chain in self._runs:
            for i, (a, b) in enumerate(chain.rel_deps):
                if deps[tid0 + i] is PREV:
                    deps[tid0 + i] = [tid0 + a] if b < 0 else [tid0 + a, tid0 + b]
        if self._singles:
            self._expand_singles(deps)
        self._expanded = (len(deps), deps, expand_releases(self._releases))
        return self._expanded

    def _expand_singles(self, deps: list[Any]) -> None:
        """Replace each int d of `deps` by the list :meth:`add` gave: d, then its slot's previous task if that is
        another one (the streams' orders replayed task by task)."""
        last: dict[tuple[int, int], int] = {}
        for j, slots in enumerate(self.slots):
            d = deps[j]
            if type(d) is int:
                prev = last.get(slots[0])
                deps[j] = [d] if prev is None or prev == d else [d, prev]
            for slot in slots:
                last[slot] = j

    def _implies(self, d: int, p: int, tid: int) -> bool:
        """Whether task d, added before task `tid`, waits for task p directly (so d ends no earlier than p), as far
        as its compact dependencies say without expanding them."""
        if d >= tid:
            return False
        got = self._deps[d]
        if got is PREV:
            return p == d - 1
        if type(got) is int:
            return p == got
        return p in got  # type: ignore[operator]

    def compact(self) -> tuple[list[list[int] | _Prev | int], CompactReleases]:
        """(dependencies, releases) in the builders' compact form, for :func:`distsim.sim.engine.run`."""
        return self._deps, self._releases

    @property
    def simulated_gpus(self) -> list[int]:
        return sorted(self.represents)

    def same_block(self, block: Any) -> Any:
        """The first block of the model equal to `block` that the flow met (the layers of a transformer stack hold
        equal blocks): the stage templates cost it once for all of them. By identity after the first meeting
        (comparing blocks walks their fields)."""
        same = self._same.get(id(block))
        if same is None:
            same = self._same[id(block)] = self._blocks.setdefault(block, block)
        return same

    def intern(self, key: str, cost: Cost, kind: str) -> int:
        idx = self._key_index.get(key)
        if idx is None:
            idx = self._key_index[key] = len(self.keys)
            self.keys.append(key)
            self.key_costs.append(cost)
            self.key_kinds.append(kind)
        return idx

    def add(
        self,
        dur: float,
        slots: tuple[tuple[int, int], ...],
        kind: int,
        name: str,
        layer: int,
        stage: int,
        mb: int,
        key: int,
        deps: list[int],
    ) -> int:
        """Append a task; it also waits for the previous task of each (gpu, stream) slot it occupies."""
        tid = len(self.duration_s)
        last = self._last
        if not self.symmetric and len(slots) == 1 and len(deps) < 2:  # one int where the slot's previous task is
            slot = slots[0]  # implied (a symmetric flow is small: it saves the time of looking)
            prev = last.get(slot)
            last[slot] = tid
            compact: list[int] | int
            if prev is None:
                compact = deps[0] if deps else deps
            elif not deps or prev == deps[0] or self._implies(deps[0], prev, tid):
                compact = deps[0] if deps else prev
            else:
                deps.append(prev)
                compact = deps
            if compact is not deps:
                self._singles = True
            self._deps.append(compact)
        else:
            self._deps.append(self._after_slots(deps, slots, tid))
        self.duration_s.append(dur)
        self.slots.append(slots)
        code = self._codes.get(id(slots))
        self.slot_code.append(self._code(slots) if code is None else code)
        self.kind.append(kind)
        self.name.append(name)
        self.layer.append(layer)
        self.stage.append(stage)
        self.microbatch.append(mb)
        self.key.append(key)
        return tid

    def _code(self, slots: tuple[tuple[int, int], ...]) -> int:
        """The :attr:`slot_code` of a slots tuple, a new one the first time it is seen."""
        code = self._codes.get(id(slots))
        if code is None:
            code = self._codes[id(slots)] = len(self.slot_sets)
            self.slot_sets.append(slots)
        return code

    def release(self, host_task: int, task: int, offset_s: float) -> None:
        """`task` starts no earlier than `offset_s` after `host_task` starts (its kernel's launch ends then)."""
        got = self._releases.get(host_task)
        if got is None:
            got = self._releases[host_task] = Releases()
        got.append((task, offset_s))
        self._expanded = None

    def add_chain(self, chain: Chain, first_deps: list[int], stage: int, mb: int,
                  host: tuple[int, float] | None = None, exact: bool = False) -> int:  # fmt: skip
        """Append a stage template's ops on one GPU at once, each after the one before: exactly the tasks and
        dependency lists that :meth:`add` would give op by op (the first op waits for `first_deps`, every later one
        for the op before it), in a fraction of the time. With `host` = (host task, offset),
        each op starts no earlier than its launch ends (the chain's launches run back to back from `offset` after
        the host task's start); a constraint the previous op implies is left out unless `exact`. Returns the last
        task id."""
        tid0 = len(self.duration_s)
        if host is not None:
            host_task, base = host
            indices = chain.launch_constrained if not exact else range(len(chain.links))
            got = self._releases.get(host_task)
            if type(got) is not list:  # none yet, or pairs (kept in their order)
                got = self._releases[host_task] = list(got or ())
            got.append(ChainRelease(tid0, base, indices, chain.launch_ends))
        self._deps.extend(chain.prevs)
        self._link_chain(chain, tid0, first_deps)
        n = len(chain.links)
        if type(self.duration_s) is list:
            durations, kinds, layers, keys = chain.durations, chain.kinds, chain.layers, chain.keys
            stages, mbs = [stage] * n, [mb] * n
        else:
            durations, kinds, layers, keys = chain.columns
            stages, mbs = array("i", (stage,)) * n, array("i", (mb,)) * n
        self.duration_s.extend(durations)
        self.slots.extend(chain.slots)
        codes = self._chain_codes.get(id(chain))
        if codes is None:
            codes = self._chain_codes[id(chain)] = array("i", [self._code(x) for x in chain.slots])
        self.slot_code.extend(codes)
        self.kind.extend(kinds)
        self.name.extend(chain.names)
        self.layer.extend(layers)
        self.stage.extend(stages)
        self.microbatch.extend(mbs)
        self.key.extend(keys)
        return tid0 + n - 1

    def _after_slots(self, waits: list[int], slots: tuple[tuple[int, int], ...], tid: int) -> list[int]:
        """`waits` with the previous task of each slot of task `tid` added where missing (a stream serves its tasks
        in order); `tid` is then its slots' last task."""
        last = self._last
        for slot in slots:
            prev = last.get(slot)
            if prev is not None and prev not in waits:
                waits.append(prev)
            last[slot] = tid
        return waits

    def _link_chain(self, chain: Chain, tid0: int, first_deps: list[int]) -> None:
        """The dependencies of a chain's ops from task `tid0` on, written as :data:`~distsim.sim.engine.PREV`: op
        i > 0 waits for op i - 1 and, on a slot met before in the chain, the previous op there (an earlier one, so
        ended by then: PREV, which deps expands); the first op on a slot in the chain (op 0 among them) also for the
        slot's last task before it, and op 0 for `first_deps`. Then the chain's ops are their slots' last tasks."""
        deps, last = self._deps, self._last
        for i in chain.slot_lookups:
            new = list(first_deps) if i == 0 else [tid0 + i - 1]
            q = last.get(chain.slots[i][0])
            if q is not None and q not in new:
                new.append(q)
            deps[tid0 + i] = new
        self._runs.append((tid0, chain))
        for slot, i in chain.last_on_slot:
            last[slot] = tid0 + i

    def add_action(self, block: ActionBlock, first_deps: list[int], host_deps: list[int], stage: int, mb: int,
                   host_name: str, exact: bool = False) -> tuple[int, int]:  # fmt: skip
        """Append a symmetric flow's action on one GPU at once: exactly the tasks and dependency lists that
        :meth:`add` of its host task (waiting for `host_deps`), :meth:`add_chain` of its chain (its first op waiting
        for `first_deps`, released by the host task) and :meth:`add` of each task after the chain (waiting for the
        chain's last op) would give, in a fraction of the time. Returns (the chain's last task, the transfer's task
        or -1)."""
        assert self.symmetric  # a full flow compacts single dependencies (add)
        tid0 = t = len(self.duration_s)
        deps, chain = self._deps, block.chain
        deps.extend(block.prevs)
        if block.host is not None:
            deps[t] = self._after_slots(list(host_deps), block.host[1], t)
            indices = chain.launch_constrained if not exact else range(len(chain.links))
            self._releases[t] = [ChainRelease(t + 1, 0.0, indices, chain.launch_ends)]
            self.name.append(host_name)
            t += 1
        self._link_chain(chain, t, first_deps)
        end = t + len(chain.links) - 1
        t = end + 1
        for _dur, slots, *_ in block.after:
            deps[t] = self._after_slots([end], slots, t)
            t += 1
        if block.members is not None:
            self.members[end + 1] = block.members
        codes = self._chain_codes.get(id(block))
        if codes is None:
            codes = self._chain_codes[id(block)] = array("i", [self._code(x) for x in block.slots])
            self._keep.append(block)  # its id stays its own while the flow lives
        n = t - tid0
        self.duration_s.extend(block.durations)
        self.slots.extend(block.slots)
        self.slot_code.extend(codes)
        self.kind.extend(block.kinds)
        self.name.extend(block.names)
        self.layer.extend(block.layers)
        self.stage.extend([stage] * n)
        self.microbatch.extend([mb] * n)
        self.key.extend(block.keys)
        return end, end + 1 if block.members is not None else -1

    @property
    def events_total(self) -> int:
        """Per-GPU events of the whole cluster (what a full trace would contain)."""
        weight = {g: len(r) for g, r in self.represents.items()}
        return sum(weight[g] for slots, k in zip(self.slots, self.kind, strict=True) if k not in (K_SHADOW, K_LAUNCH)
                   for g, _ in slots)  # fmt: skip

    @property
    def events_unique(self) -> int:
        return len(self.keys)


def layer_weights(model: Model, strategy: Strategy, costs: CostSource) -> list[float]:
    """Estimated forward + backward seconds per layer at the strategy's micro-batch size and tp degree."""
    dtype = model.precision.name
    known: dict[Any, tuple[float, float]] = {}  # equal blocks of different layers cost the same: once
    out = []
    for layer in model.layers:
        total = 0.0
        for block in layer.blocks:
            got = known.get(block)
            if got is None:
                f, b = (costs.compute(ComputeEvent(block, phase, strategy.micro_batch_size, strategy.tp, dtype)).seconds
                        for phase in "FB")  # fmt: skip
                got = known[block] = (f, b)
            total += got[0]
            total += got[1]
        out.append(total)
    return out


PartitionMemo = dict[str, dict[tuple[Any, ...], tuple[Model, "CostSource | None", Any]]]
"""What :func:`memoised` answered: per kind of question, by (id(model), id(costs), the rest of the question), each
entry with its model and costs (partitions: the strategy's partition, micro-batch size, tp and stages)."""
_MEMO_ENTRIES = 256
_PARTITIONS: ContextVar[PartitionMemo | None] = ContextVar("distsim_partitions", default=None)


@contextmanager
def shared_partitions(memo: PartitionMemo | None = None) -> Iterator[None]:
    """Within the block, :func:`resolve_partition` (and the other questions :func:`memoised` answers) answers each
    (model, costs, shape) once. A search resolves the
    same partition for a configuration's memory check, its task estimate and its flow, and again for every
    configuration of the same shape (micro-batch size, tp, stages), and each answer weighs every layer's cost:
    about 7 ms for GPT-3 175B, a tenth of a grid's work. Scoped, not global, because model and costs are keyed by
    identity (hashing a model walks all its layers), which is only sound while they do not change: a search holds
    them fixed. Each entry keeps its model and costs alive, so an identity cannot be reused by another object.
    `memo` carries the answers from one block to the next (a search's worker, one configuration per block); without
    one, a block inside another shares the outer block's (simulate() opens one, and a search calls it inside its own).
    """
    if memo is None:
        memo = _PARTITIONS.get()
    token = _PARTITIONS.set({} if memo is None else memo)
    try:
        yield
    finally:
        _PARTITIONS.reset(token)


def memoised(what: str, model: Model, costs: CostSource | None, question: tuple[Any, ...],
             answer: Callable[[], Any]) -> Any:  # fmt: skip
    """`answer()`, asked once per (`what`, model, costs, `question`) inside :func:`shared_partitions` (model and
    costs by identity, checked on a hit); outside it, asked every time."""
    memo = _PARTITIONS.get()
    if memo is None:
        return answer()
    table = memo.get(what)
    if table is None:
        table = memo[what] = {}
    key = (id(model), id(costs), *question)
    hit = table.get(key)
    if hit is not None and hit[0] is model and hit[1] is costs:
        return hit[2]
    got = answer()
    if len(table) >= _MEMO_ENTRIES:  # models made per configuration (rank_view under ep or cp) would pile up
        table.clear()  # each kind on its own: a search asks one memory question per configuration
    table[key] = (model, costs, got)
    return got


def resolve_partition(model: Model, strategy: Strategy, costs: CostSource) -> tuple[tuple[int, int], ...]:
    """[start, end) layer ranges per virtual stage: the strategy's partition or a compute-balanced one (memoised
    inside :func:`shared_partitions`)."""
    question = (strategy.partition, strategy.micro_batch_size, strategy.tp, strategy.num_stages)
    return memoised("partition", model, costs, question, lambda: _resolve_partition(model, strategy, costs))  # type: ignore[no-any-return]


def _resolve_partition(model: Model, strategy: Strategy, costs: CostSource) -> tuple[tuple[int, int], ...]:
    counts = strategy.partition
    if counts is None:
        counts = balanced_partition(layer_weights(model, strategy, costs), strategy.num_stages)
    return ranges(counts)
