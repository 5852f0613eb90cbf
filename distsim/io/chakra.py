"""Chakra execution traces (ET) per rank from a simulation's event flow: the input of ASTRA-sim and the MLCommons
workload format, read by ``mlc-chakra``'s own tools (``chakra.src.third_party.utils.protolib``).

A rank's file, ``<stem>.<rank>.et``, is a length-prefixed ``GlobalMetadata`` message followed by one ``Node`` per
task that rank runs, in the flow's emission order (a topological order, so every dependency names an earlier node):

- compute (forward, backward, recompute, optimizer step) as ``COMP_NODE`` with ``duration_micros``;
- a collective as ``COMM_COLL_NODE`` with ``comm_type`` (from the event key's collective), ``comm_size`` (the key's
  bytes) and ``pg_name``, the name of its group of ranks; the groups are listed in the metadata (``comm_groups``)
  and in ``<stem>.comm_group.json`` (ASTRA-sim's ``--comm-group-configuration``: group name -> ranks);
- a point-to-point transfer as ``COMM_SEND_NODE`` on the sender and ``COMM_RECV_NODE`` on the receiver, with
  ``comm_src``, ``comm_dst``, ``comm_tag`` (the same on both ends) and ``comm_size``.

Dependencies are ``data_deps``, as Chakra's PyTorch converter emits them and ASTRA-sim's feeder schedules by. They are
the flow's dependencies restricted to the rank: a dependency on another rank's transfer is the matching receive here;
one on another rank's other work is dropped (a collective synchronises its members itself). Interference shadows and
host launches are not exported, but what waits for them waits for what they waited for (a kernel released by a launch
waits for what the launch waited for), so no ordering on the rank is lost.

Which GPUs a communication spans is what the timeline's columns say (:mod:`distsim.sim.timeline`): the flow's
``members`` (a transfer's sender and receiver, a collective's group), else, for a template's tp, ep or cp op, the
placement's group (``model_group``). A symmetric flow simulates one GPU per pipeline rank; every GPU it stands for gets
its nodes, with its own peers and groups (``GroupMap.moved``; design (a): a full per-GPU export of a cheap
simulation). A symmetric flow without a placement (a burst plan's classes) is refused: simulate it with ``--full``.

The pure part (:func:`chakra_ranks`, :class:`EtNode`) needs no Chakra; writing needs ``mlc-chakra``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distsim.core.errors import DistsimError
from distsim.sim.costs import CommEvent
from distsim.sim.flow.events import (
    K_CP,
    K_DP,
    K_EP,
    K_LAUNCH,
    K_P2P,
    K_SHADOW,
    K_TP,
    KINDS,
    STREAMS,
    EventFlow,
)
from distsim.sim.timeline import GroupMap, model_group

if TYPE_CHECKING:
    from distsim.plans.result import SimResult

SCHEMA = "1.0.2-chakra.1.0.0"
"""The ``schema`` attribute of the metadata, as Chakra's own converters write it."""
COMM_TYPES = {"all_reduce": 0, "all_gather": 2, "all_to_all": 6, "reduce_scatter": 7, "cp_ring": 2}
"""Collective in an event key -> Chakra's ``CollectiveCommType`` (et_def.proto). Ring attention's key/value passes
(``cp_ring``) move what an all-gather over the context-parallel group moves; the node keeps
``distsim_collective`` to tell them apart."""
SKIPPED = frozenset({K_SHADOW, K_LAUNCH})
"""Kinds not exported: interference shadows (compute time lost to overlapped communication, not work of its own)
and host launches (the host enqueuing kernels; not a device node)."""
COLLECTIVE_KINDS = frozenset({K_TP, K_DP, K_EP, K_CP})
COMP, COLL, SEND, RECV = "COMP_NODE", "COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE"
NODE_TYPES = {COMP: 4, SEND: 5, RECV: 6, COLL: 7}
"""Node type name -> Chakra's ``NodeType`` value."""


@dataclass(frozen=True)
class EtNode:
    """One Chakra node, as plain values (the writer turns it into Chakra's ``Node`` message)."""

    id: int
    name: str
    type: str
    """``COMP_NODE``, ``COMM_COLL_NODE``, ``COMM_SEND_NODE`` or ``COMM_RECV_NODE``."""
    deps: tuple[int, ...]
    start_us: int
    duration_us: int
    attrs: tuple[tuple[str, Any], ...]
    """(name, value): a bool, int, float or str."""
    task: int
    """The flow task it comes from (also the ``distsim_task`` attribute)."""


def comm_event(key: str) -> CommEvent:
    """The communication event a collective's or transfer's event key names; one line if it names none."""
    event = CommEvent.of_key(key)
    if event is None:
        raise DistsimError(f"Chakra export: cannot read communication event key {key!r}")
    return event


@dataclass
class ChakraRanks:
    """Every rank's nodes, computed on demand (:meth:`nodes`), and the process groups their collectives use."""

    flow: EventFlow
    start_s: list[float]
    end_s: list[float]
    deps: list[tuple[int, ...]]
    """Per exported task: the exported tasks it waits for (through skipped ones); empty for the others."""
    on_gpu: dict[int, list[int]]
    """Simulated GPU -> the exported tasks it takes part in, in order (a transfer: on its sender's and receiver's)."""
    groups: dict[tuple[int, ...], str] = field(default_factory=dict)
    """Process group (ranks) -> its ``pg_name``, numbered as first met."""
    _seen: dict[tuple[Any, ...], tuple[int, ...]] = field(default_factory=dict, repr=False)
    """What :meth:`instance` found, by (members or kind, GPU they are moved from, rank): most tasks repeat one."""

    @cached_property
    def ranks(self) -> list[int]:
        """Every GPU of the iteration, simulated or stood for."""
        return sorted(self._sim_of)

    @cached_property
    def _sim_of(self) -> dict[int, int]:
        return {g: sim for sim, gs in self.flow.represents.items() for g in gs}

    @cached_property
    def _moves(self) -> GroupMap | None:
        """How a simulated GPU's groups and peers read on the GPUs it stands for; None when every GPU was
        simulated (each reads its own)."""
        flow = self.flow
        return GroupMap(flow.placement.grid) if flow.symmetric and flow.placement is not None else None

    def simulated(self, rank: int) -> int:
        """The simulated GPU whose tasks `rank` runs."""
        return self._sim_of[rank]

    def name_groups(self) -> dict[tuple[int, ...], str]:
        """Name every process group, rank by rank (each file's metadata lists them all); returns :attr:`groups`."""
        flow = self.flow
        for rank in self.ranks:
            for task in self.on_gpu.get(self.simulated(rank), ()):
                if flow.kind[task] in COLLECTIVE_KINDS:
                    self.pg_name(self.group(task, rank))
        return self.groups

    def instance(self, task: int, rank: int, end: int | None = None) -> tuple[int, ...]:
        """The GPUs of communication `task` as `rank` runs it, as the timeline's columns name them (one way for the
        project to say it): the flow's :attr:`~distsim.sim.flow.events.EventFlow.members` (a transfer's sender and
        receiver, a collective's group) moved to `rank` (:meth:`GroupMap.moved`; `end`: the member whose place
        `rank` takes, by default `rank`'s simulated GPU); a template's tp, ep or cp op, `rank`'s group in the
        placement (:func:`model_group`)."""
        flow = self.flow
        members = flow.members.get(task)
        if members is None:
            kind = flow.kind[task]
            if kind not in (K_TP, K_EP, K_CP) or flow.placement is None:
                raise DistsimError(f"Chakra export: no group for a {KINDS[kind]} task ({flow.name[task]})")
            key: tuple[Any, ...] = (kind, rank)
            found = self._seen.get(key)
            if found is None:
                found = self._seen[key] = model_group(flow, rank, kind)
            return found
        moves = self._moves
        if moves is None:
            return members
        src = self.simulated(rank) if end is None else members[end]
        key = (members, src, rank)
        found = self._seen.get(key)
        if found is None:
            found = self._seen[key] = moves.moved(members, src, rank)
        return found

    def group(self, task: int, rank: int) -> tuple[int, ...]:
        """The ranks of collective `task` as `rank` runs it, in order."""
        return tuple(sorted(self.instance(task, rank)))

    def pg_name(self, group: tuple[int, ...]) -> str:
        name = self.groups.get(group)
        if name is None:
            name = self.groups[group] = str(len(self.groups) + 1)
        return name

    def nodes(self, rank: int) -> list[EtNode]:
        """`rank`'s nodes, in emission order; their ids number them from 0."""
        flow = self.flow
        sim = self.simulated(rank)
        node_of: dict[int, int] = {}
        out: list[EtNode] = []
        for task in self.on_gpu.get(sim, ()):
            kind = flow.kind[task]
            attrs: list[tuple[str, Any]] = [("is_cpu_op", False)]
            stream = next(s for g, s in flow.slots[task] if g == sim) if kind != K_P2P else None
            if kind == K_P2P:
                sending = self._sim_of[flow.members[task][0]] == sim
                ntype = SEND if sending else RECV
                src, dst = self.instance(task, rank, end=0 if sending else 1)
                ck = comm_event(flow.keys[flow.key[task]])
                attrs += [("comm_src", src), ("comm_dst", dst), ("comm_tag", task), ("comm_size", ck.nbytes)]
                if sending:
                    stream = flow.slots[task][0][1]
            elif kind in COLLECTIVE_KINDS:
                ntype = COLL
                ck = comm_event(flow.keys[flow.key[task]])
                if ck.collective not in COMM_TYPES:
                    raise DistsimError(f"Chakra export: no Chakra collective for {ck.collective!r} ({flow.name[task]})")
                group = self.group(task, rank)
                if len(group) != ck.group_size:
                    raise DistsimError(f"Chakra export: {flow.name[task]!r} is a collective of {ck.group_size} GPUs, "
                                       f"but rank {rank} runs it with {list(group)}")  # fmt: skip
                attrs += [("comm_type", COMM_TYPES[ck.collective]), ("comm_size", ck.nbytes),
                          ("pg_name", self.pg_name(group)), ("distsim_collective", ck.collective)]  # fmt: skip
            else:
                ntype = COMP
            if stream is not None:
                attrs.append(("stream", stream))
            attrs += [("distsim_task", task), ("distsim_kind", KINDS[kind]), ("stage", flow.stage[task]),
                      ("microbatch", flow.microbatch[task]), ("layer", flow.layer[task])]  # fmt: skip
            node_of[task] = len(out)
            start, end = self.start_s[task], self.end_s[task]
            out.append(EtNode(len(out), node_name(flow, task), ntype, tuple(sorted(node_of[j] for j in self.deps[task]
                                                                           if j in node_of)),
                              round(start * 1e6), max(0, round((end - start) * 1e6)), tuple(attrs), task))  # fmt: skip
        return out


def node_name(flow: EventFlow, task: int) -> str:
    """A node's name: the task's, with its kind (a layer's forward and backward share a name) and micro-batch."""
    kind, name, mb = flow.kind[task], flow.name[task], flow.microbatch[task]
    head = f"{KINDS[kind]} {name}" if kind != K_P2P else name
    return f"{head} mb{mb}" if mb >= 0 else head


def chakra_ranks(result: SimResult) -> ChakraRanks:
    """What every rank's Chakra trace holds, from a simulation result (no file written, Chakra not needed)."""
    flow = result.flow
    if flow.symmetric and flow.placement is None:
        raise DistsimError("Chakra export of a symmetric plan simulation is not supported: simulate it with --full")
    sim_of = {g: sim for sim, gs in flow.represents.items() for g in gs}
    exported = [k not in SKIPPED for k in flow.kind]
    on_gpu: dict[int, list[int]] = {}
    for task, keep in enumerate(exported):
        if not keep:
            continue
        if flow.kind[task] == K_P2P:
            gpus = dict.fromkeys(sim_of[g] for g in transfer_pair(flow, task))
            if len(gpus) == 1:  # a transfer within one GPU: nothing to send, only an ordering
                exported[task] = False
                continue
        else:
            gpus = dict.fromkeys(g for g, _ in flow.slots[task])
        for g in gpus:
            on_gpu.setdefault(g, []).append(task)
    deps = effective_deps(flow, exported)
    return ChakraRanks(flow, list(result.tasks.start_s), list(result.tasks.end_s), deps, on_gpu)


def transfer_pair(flow: EventFlow, task: int) -> tuple[int, ...]:
    """Transfer `task`'s (sender, receiver), as the flow recorded them. A re-distribution among more GPUs (a burst
    plan's) records the GPUs that move, not who sends to whom: it has no send/receive pair to export."""
    members = flow.members.get(task, ())
    if len(members) != 2:
        raise DistsimError(f"Chakra export: cannot tell where transfer {flow.name[task]!r} goes "
                           f"(it moves among GPUs {list(members)})")  # fmt: skip
    return members


def effective_deps(flow: EventFlow, exported: list[bool]) -> list[tuple[int, ...]]:
    """Per task (empty for one not exported): the exported tasks it waits for, directly or through tasks that are
    not exported. A launch's release (its kernel starts after the launch) counts as a dependency. What a skipped
    task stands for is kept small: of several tasks on one stream only the last (it waits for the others), transfers
    all (their receiving ends do not wait for each other)."""
    released: dict[int, list[int]] = {}
    for host, tasks in flow.releases.items():
        for task, _ in tasks:
            released.setdefault(task, []).append(host)
    through: dict[int, tuple[int, ...]] = {}
    out: list[tuple[int, ...]] = [()] * len(flow)
    for i in range(len(flow)):
        acc: set[int] = set()
        for d in (*flow.deps[i], *released.get(i, ())):
            if exported[d]:
                acc.add(d)
            else:
                acc.update(through[d])
        if exported[i]:
            out[i] = tuple(sorted(acc))
        else:
            through[i] = _latest_per_stream(flow, acc)
    return out


def _latest_per_stream(flow: EventFlow, tasks: set[int]) -> tuple[int, ...]:
    """`tasks` less those another of them on one of their streams follows (it waits for them, in order)."""
    latest: dict[tuple[int, int], int] = {}
    keep = set()
    for t in tasks:
        if flow.kind[t] == K_P2P:
            keep.add(t)
            continue
        for slot in flow.slots[t]:
            if latest.get(slot, -1) < t:
                latest[slot] = t
    keep.update(latest.values())
    return tuple(sorted(keep))


# ------------------------------------------------------------------------------------------------------- writing
def _chakra() -> tuple[Any, Any]:
    """Chakra's protobuf module and its message encoder (one line if mlc-chakra is not installed)."""
    try:
        from chakra.schema.protobuf import et_def_pb2
        from chakra.src.third_party.utils.protolib import encodeMessage
    except ImportError:
        raise DistsimError("--trace-format chakra needs the mlc-chakra package: pip install mlc-chakra") from None
    return et_def_pb2, encodeMessage


def _attr(pb: Any, name: str, value: Any) -> Any:
    if isinstance(value, bool):
        return pb.AttributeProto(name=name, bool_val=value)
    if isinstance(value, int):
        return pb.AttributeProto(name=name, int64_val=value)
    if isinstance(value, float):
        return pb.AttributeProto(name=name, double_val=value)
    if isinstance(value, (list, tuple)):
        return pb.AttributeProto(name=name, string_list=pb.StringList(values=[str(v) for v in value]))
    return pb.AttributeProto(name=name, string_val=str(value))


def _message(pb: Any, node: EtNode, cache: dict[tuple[str, Any, type], Any]) -> Any:
    """Chakra's ``Node`` message of `node`; `cache` keeps the attribute messages made so far (most repeat)."""
    msg = pb.Node(id=node.id, name=node.name, type=NODE_TYPES[node.type], start_time_micros=max(0, node.start_us),
                  duration_micros=node.duration_us)  # fmt: skip
    msg.data_deps.extend(node.deps)
    msg.attr.extend(_cached_attr(pb, cache, name, value) for name, value in node.attrs)
    return msg


def _cached_attr(pb: Any, cache: dict[tuple[str, Any, type], Any], name: str, value: Any) -> Any:
    key = (name, value, type(value))  # False and 0 are equal keys otherwise
    found = cache.get(key)
    if found is None:
        found = cache[key] = _attr(pb, name, value)
    return found


def metadata(ranks: ChakraRanks, result: SimResult, rank: int) -> list[tuple[str, Any]]:
    """The metadata attributes of `rank`'s file (the process groups only once every rank's nodes are known)."""
    from distsim import __version__

    flow = ranks.flow
    return [("schema", SCHEMA), ("generator", f"distsim {__version__}"), ("rank", rank),
            ("num_ranks", len(ranks.ranks)), ("model", result.model.name), ("cluster", result.cluster.name),
            ("strategy", result.label), ("iteration_time_s", float(result.iteration_time_s)),
            ("simulated_symmetric", bool(flow.symmetric)), ("streams", list(STREAMS)),
            ("comm_groups", json.dumps({name: list(g) for g, name in ranks.groups.items()}))]  # fmt: skip


def write_chakra_traces(result: SimResult, directory: Path, stem: str = "distsim") -> list[Path]:
    """Write one Chakra execution trace per rank, ``<stem>.<rank>.et`` in `directory`, and the process groups
    (``<stem>.comm_group.json``); return the traces' paths, in rank order."""
    from distsim.io.output import open_output
    from distsim.io.rank_traces import make_directory

    if not stem or "/" in stem or "\\" in stem:
        raise DistsimError(f"Chakra export: the file stem must be a plain name, got {stem!r}")
    pb, encode = _chakra()
    path = make_directory(directory)
    ranks = chakra_ranks(result)
    ranks.name_groups()  # before any file: each file's metadata lists every group
    cache: dict[tuple[str, Any, type], Any] = {}
    out = []
    for r in ranks.ranks:
        target = path / f"{stem}.{r}.et"
        head = pb.GlobalMetadata(version="1.0.0", attr=[_attr(pb, k, v) for k, v in metadata(ranks, result, r)])
        with open_output(target, binary=True) as fh:
            encode(fh, head)
            for node in ranks.nodes(r):
                encode(fh, _message(pb, node, cache))
        out.append(target)
    groups = {name: list(g) for g, name in ranks.groups.items()}
    with open_output(path / f"{stem}.comm_group.json", binary=False) as fh:
        json.dump(groups, fh, indent=1)
        fh.write("\n")
    return out
