"""Chakra execution traces per rank, read back with mlc-chakra's own reader (``protolib.decodeMessage`` after the
``GlobalMetadata``, as Chakra's visualizer and jsonizer read a file): every node's type, size and dependencies match
the simulated event flow, every send meets its receive, and a symmetric simulation exports what a full one does."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("chakra.schema.protobuf.et_def_pb2", reason="mlc-chakra (the Chakra reader) is not installed")

from chakra.schema.protobuf import et_def_pb2 as pb
from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd

from distsim import Strategy, get_cluster, get_model, simulate
from distsim.core.errors import DistsimError
from distsim.io.chakra import write_chakra_traces
from distsim.sim.flow.events import KINDS, FlowOptions

COMPUTE = {"forward", "backward", "recompute", "optimizer"}
SKIPPED = {"interference", "launch"}


def read_et(path: Path) -> tuple[dict[str, Any], list[Any]]:
    """(metadata attributes, nodes) of a Chakra trace, read as Chakra's own tools read one."""
    fh = openFileRd(str(path))
    try:
        meta = pb.GlobalMetadata()
        assert decodeMessage(fh, meta)
        nodes = []
        while True:
            node = pb.Node()
            if not decodeMessage(fh, node):
                break
            nodes.append(node)
    finally:
        fh.close()
    return attrs(meta), nodes


def attrs(msg: Any) -> dict[str, Any]:
    out = {}
    for a in msg.attr:
        value = getattr(a, a.WhichOneof("value"))
        out[a.name] = list(value.values) if hasattr(value, "values") else value
    return out


def key_bytes(flow: Any, task: int) -> int:
    return int(re.search(r"/bytes=(\d+)", flow.keys[flow.key[task]]).group(1))  # type: ignore[union-attr]


def runs_on(flow: Any, task: int, rank: int) -> bool:
    """Whether a task is on a rank's trace: exported, and occupying the rank's GPU or received there."""
    kind = KINDS[flow.kind[task]]
    if kind in SKIPPED:
        return False
    return rank in {g for g, _ in flow.slots[task]} or (kind == "p2p" and flow.name[task].endswith(f"->{rank}"))


def expected_deps(flow: Any) -> list[set[int]]:
    """Per task: the exported tasks it waits for, through interference shadows and host launches (a kernel also
    waits for the launch that releases it)."""
    released: dict[int, list[int]] = {}
    for host, tasks in flow.releases.items():
        for task, _ in tasks:
            released.setdefault(task, []).append(host)
    out: list[set[int]] = []
    for i in range(len(flow)):
        acc: set[int] = set()
        for d in (*flow.deps[i], *released.get(i, ())):
            acc |= out[d] if KINDS[flow.kind[d]] in SKIPPED else {d}
        out.append(acc)
    return out


def ancestors(nodes: list[Any]) -> list[set[int]]:
    out: list[set[int]] = []
    for node in nodes:
        assert all(d < node.id for d in node.data_deps)  # emitted in a topological order
        out.append(set(node.data_deps).union(*(out[d] for d in node.data_deps)))
    return out


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[Path]]:
    """gpt2-345m on two single-GPU nodes, 1M2P1D with 4 micro-batches, 1F1B (hosts modelled: launches skipped)."""
    cluster = get_cluster("dapple-b").with_nodes(2)
    result = simulate(get_model("gpt2-345m"), cluster, Strategy(pp=2, num_micro_batches=4, schedule="1f1b"))
    return result, write_chakra_traces(result, tmp_path_factory.mktemp("et"))


def test_one_file_per_rank_named_as_chakra_names_them_with_the_metadata_first(pipeline: tuple[Any, list[Path]]) -> None:
    result, paths = pipeline
    assert [p.name for p in paths] == ["distsim.0.et", "distsim.1.et"]
    for rank, path in enumerate(paths):
        meta, nodes = read_et(path)
        assert meta["rank"] == rank and meta["num_ranks"] == 2 and meta["schema"].startswith("1.0.2-chakra")
        assert [n.id for n in nodes] == list(range(len(nodes)))
    assert any(KINDS[k] == "launch" for k in result.flow.kind)  # the skipping below is exercised


def test_every_task_becomes_a_node_of_its_type_size_and_time_on_its_ranks(pipeline: tuple[Any, list[Path]]) -> None:
    result, paths = pipeline
    flow, tasks = result.flow, result.tasks
    for rank, path in enumerate(paths):
        _, nodes = read_et(path)
        seen = set()
        for node in nodes:
            a = attrs(node)
            task = a["distsim_task"]
            kind = KINDS[flow.kind[task]]
            seen.add(task)
            assert node.duration_micros == round((tasks.end_s[task] - tasks.start_s[task]) * 1e6)
            if kind in COMPUTE:
                assert node.type == pb.COMP_NODE
            elif kind == "p2p":
                src, dst = (int(x) for x in re.search(r"(\d+)->(\d+)", flow.name[task]).groups())  # stage = GPU
                assert node.type == (pb.COMM_SEND_NODE if rank == src else pb.COMM_RECV_NODE)
                assert (a["comm_src"], a["comm_dst"], a["comm_size"]) == (src, dst, key_bytes(flow, task))
            else:  # the tied embedding copies' gradient all-reduce between the two stages
                assert node.type == pb.COMM_COLL_NODE and a["comm_type"] == pb.ALL_REDUCE
                assert a["comm_size"] == key_bytes(flow, task)
        assert seen == {i for i in range(len(flow)) if runs_on(flow, i, rank)}


def test_dependencies_are_the_flows_on_the_rank_through_skipped_tasks(pipeline: tuple[Any, list[Path]]) -> None:
    """Each node waits for no more than the flow says (mapped to this rank's nodes: a transfer from another rank is
    its receive here), and for everything it says, directly or through another dependency."""
    result, paths = pipeline
    flow = result.flow
    want = expected_deps(flow)
    for path in paths:
        _, nodes = read_et(path)
        node_of = {attrs(n)["distsim_task"]: n.id for n in nodes}
        reach = ancestors(nodes)
        for node in nodes:
            expected = {node_of[t] for t in want[attrs(node)["distsim_task"]] if t in node_of}
            assert set(node.data_deps) <= expected
            assert expected <= reach[node.id]


def test_every_send_meets_one_receive_with_its_tag_and_size(pipeline: tuple[Any, list[Path]]) -> None:
    _, paths = pipeline
    ends: dict[int, list[tuple[int, int, int, int]]] = {pb.COMM_SEND_NODE: [], pb.COMM_RECV_NODE: []}
    for path in paths:
        for node in read_et(path)[1]:
            if node.type in ends:
                a = attrs(node)
                ends[node.type].append((a["comm_src"], a["comm_dst"], a["comm_tag"], a["comm_size"]))
    sends, recvs = ends[pb.COMM_SEND_NODE], ends[pb.COMM_RECV_NODE]
    assert len(sends) == 2 * 4 and sorted(sends) == sorted(recvs) and len(set(sends)) == len(sends)


def test_a_data_parallel_gradient_all_reduce_spans_both_ranks(tmp_path: Path) -> None:
    model = get_model("gpt2-345m")
    result = simulate(model, get_cluster("dapple-b").with_nodes(2), Strategy(dp=2, num_micro_batches=2))
    paths = write_chakra_traces(result, tmp_path, stem="dp")
    groups = json.loads((tmp_path / "dp.comm_group.json").read_text())
    grads = round(model.params * model.precision.grad_bytes)
    for path in paths:
        meta, nodes = read_et(path)
        colls = [attrs(n) for n in nodes if n.type == pb.COMM_COLL_NODE]
        assert [(a["comm_type"], a["comm_size"]) for a in colls] == [(pb.ALL_REDUCE, grads)]
        assert groups[colls[0]["pg_name"]] == [0, 1] and json.loads(meta["comm_groups"]) == groups
        coll = next(n for n in nodes if n.type == pb.COMM_COLL_NODE)
        step = next(n for n in nodes if attrs(n)["distsim_kind"] == "optimizer")
        assert coll.id in step.data_deps  # the optimizer step waits for the gradients


def canonical(paths: list[Path]) -> list[list[tuple]]:
    """Per rank, every node as what it does (tags, group names and task ids aside: they number differently)."""
    groups = json.loads((paths[0].parent / "distsim.comm_group.json").read_text())
    out = []
    for path in paths:
        rows = []
        for node in read_et(path)[1]:
            a = attrs(node)
            group = tuple(groups[a["pg_name"]]) if "pg_name" in a else None
            rows.append((node.name, node.type, tuple(node.data_deps), node.duration_micros, a.get("comm_size"),
                         a.get("comm_src"), a.get("comm_dst"), a.get("comm_type"), group))  # fmt: skip
        out.append(rows)
    return out


@pytest.mark.parametrize("sp, blocking", [(False, False), (True, True)])
def test_a_symmetric_simulation_exports_every_gpu_as_a_full_one_does(tmp_path: Path, sp: bool, blocking: bool) -> None:
    """2M2P2D on 8 GPUs: one simulated GPU per pipeline rank stands for four; each gets its own peers and groups.
    With sequence parallelism a stage starts with a collective of its tp group (which of them receives a transfer
    is the placement's pairing); with blocking sends a transfer holds the sender's compute stream."""
    model, cluster = get_model("gpt2-345m"), get_cluster("distsim-testbed").with_nodes(2)
    strategy = Strategy(tp=2, pp=2, dp=2, num_micro_batches=3, sequence_parallel=sp)
    exports = []
    for symmetric in (None, False):
        options = FlowOptions(symmetric=symmetric, p2p_blocking=blocking)
        result = simulate(model, cluster, strategy, options=options)
        assert result.flow.symmetric == (symmetric is None)
        paths = write_chakra_traces(result, tmp_path / str(symmetric))
        assert len(paths) == 8
        exports.append(canonical(paths))
    assert exports[0] == exports[1]
    tp_groups = {row[8] for rows in exports[0] for row in rows if row[7] is not None and len(row[8]) == 2}
    assert {(0, 1), (2, 3), (4, 5), (6, 7)} <= tp_groups


def test_bad_input_is_one_line(
    pipeline: tuple[Any, list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, _ = pipeline
    with pytest.raises(DistsimError, match="plain name"):
        write_chakra_traces(result, tmp_path, stem="a/b")
    monkeypatch.setitem(__import__("sys").modules, "chakra.schema.protobuf", None)
    with pytest.raises(DistsimError, match="pip install mlc-chakra"):
        write_chakra_traces(result, tmp_path)


def test_a_redistribution_among_more_than_two_gpus_is_refused_in_one_line(tmp_path: Path) -> None:
    """A burst plan's re-distribution records the GPUs that move (``EventFlow.members``), not who sends to whom:
    there is no send/receive pair to export, so it is refused rather than guessed."""
    from distsim.plans import burst_plan

    model, cluster = get_model("gpt2-345m"), get_cluster("dgx-h100").with_nodes(1)
    plan = burst_plan(model, cluster, [2, 4] + [2] * (len(model.layers) - 2), 8)
    result = simulate(model, cluster, plan, options=FlowOptions(symmetric=False))
    with pytest.raises(DistsimError, match=r"where transfer .* goes \(it moves among GPUs \[0, 1, 2, 3\]\)"):
        write_chakra_traces(result, tmp_path)
