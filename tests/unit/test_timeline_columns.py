"""The timeline's communication columns (key, bytes, peer, group): what each row's event is, what it moves and
between which GPUs, the same whether one GPU per pipeline rank was simulated and its rows copied or every GPU."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest

from distsim import Strategy, get_cluster, get_model, simulate
from distsim.io.trace_export import write_csv
from distsim.sim.flow.events import FlowOptions
from distsim.sim.timeline import COMM_COLUMNS, parse_ranges

COLS = ["gpu", "kind", "name", "key", "bytes", "peer", "group", "start_s"]


def _rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[COLS].astype(str).sort_values(COLS).reset_index(drop=True)


@pytest.mark.parametrize(
    "model, nodes, strategy",
    [
        ("gpt2-345m", 2, Strategy(tp=2, pp=2, dp=4, num_micro_batches=2)),  # tp, p2p, dp and tied all-reduces
        ("mixtral-8x7b:layers=2,seq=512", 2, Strategy(tp=2, pp=2, dp=4, ep=2, num_micro_batches=2)),
        ("llama3-8b:layers=2,seq=1024", 2, Strategy(tp=2, dp=8, cp=2, num_micro_batches=2)),
    ],
)
def test_symmetric_rows_copied_read_as_every_gpu_simulated(model: str, nodes: int, strategy: Strategy) -> None:
    """A symmetric simulation's rows copied to the GPUs they stand for name those GPUs' own peers and groups:
    equal to the rows of simulating every GPU."""
    m, cluster = get_model(model), get_cluster("dgx-h100").with_nodes(nodes)
    sym = simulate(m, cluster, strategy)
    assert sym.flow.symmetric
    full = simulate(m, cluster, strategy, options=FlowOptions(symmetric=False))
    pd.testing.assert_frame_equal(_rows(sym.timeline.expand().df), _rows(full.timeline.df))


def test_columns_say_what_moves_between_whom() -> None:
    """gpt2-345m, 2M2P4D on two DGX H100 nodes (tp, dp, pp innermost first: rank 0 is GPUs 0-7, rank 1 8-15)."""
    r = simulate(get_model("gpt2-345m"), get_cluster("dgx-h100").with_nodes(2),
                 Strategy(tp=2, pp=2, dp=4, num_micro_batches=2))  # fmt: skip
    df = r.timeline.expand().df
    assert set(COMM_COLUMNS) <= set(df.columns)
    compute = df[df.kind.isin(["forward", "backward", "optimizer"])]
    assert (compute.bytes == 0).all() and (compute.peer == -1).all() and (compute.group == "").all()
    assert set(df.key.dropna()) - {""} <= set(r.cost_table().event)  # joins the cost table
    comm = df[df.kind.isin(["tp_allreduce", "p2p", "dp_allreduce"])]
    assert (comm.bytes > 0).all()
    assert all(f"bytes={b}" in k for k, b in zip(comm.key, comm.bytes, strict=True))
    on5 = comm[comm.gpu == 5]  # rank 0, replica 2, tp rank 1
    assert set(on5[on5.kind == "tp_allreduce"].group) == {"4-5"}
    assert set(on5[on5.kind == "p2p"].peer) == {13}  # the same replica and tp rank of pipeline rank 1
    grads = on5[on5.name == "grads rank 0"]
    assert len(grads) == 1 and parse_ranges(grads.group.iloc[0]) == (1, 3, 5, 7)
    for g, peer in zip(df[df.kind == "p2p"].gpu, df[df.kind == "p2p"].peer, strict=True):
        assert peer == (g + 8 if g < 8 else g - 8)


def test_expanded_csv_holds_each_gpus_own_groups() -> None:
    r = simulate(get_model("gpt2-345m"), get_cluster("dgx-h100").with_nodes(2),
                 Strategy(tp=2, pp=2, dp=4, num_micro_batches=1))  # fmt: skip
    out = io.StringIO()
    write_csv(out, r.timeline, expand=True)
    written = pd.read_csv(io.StringIO(out.getvalue()), keep_default_na=False)
    expanded = r.timeline.expand().df
    assert list(written.gpu) == list(expanded.gpu)
    assert list(written.group) == [str(g) for g in expanded.group]
    assert list(written.peer) == list(expanded.peer)


def test_kineto_files_name_each_ranks_own_groups(tmp_path: Path) -> None:
    """The per-rank Kineto export of a symmetric simulation gives every rank its own peers and groups: the same
    files' (name, group, peer) as simulating every GPU."""
    from distsim.io.kineto import write_kineto_traces

    model, cluster = get_model("gpt2-345m"), get_cluster("dgx-h100").with_nodes(2)
    strategy = Strategy(tp=2, pp=2, dp=4, num_micro_batches=1)
    seen = []
    for options in (FlowOptions(), FlowOptions(symmetric=False)):
        out = tmp_path / str(options.symmetric)
        out.mkdir()
        paths = write_kineto_traces(simulate(model, cluster, strategy, options=options).timeline, out)
        seen.append([sorted((e["name"], e["args"].get("group", ""), e["args"].get("peer", -1))
                            for e in json.loads(p.read_text())["traceEvents"] if e.get("cat") == "kernel")
                     for p in paths])  # fmt: skip
    assert len(seen[0]) == 16 and seen[0] == seen[1]


def test_an_event_key_reads_back_as_the_event_that_wrote_it() -> None:
    """CommEvent.of_key is CommEvent.key's inverse, also at the start of a derived key; a compute or optimizer key
    is no communication event."""
    from distsim.sim.costs import CommEvent

    for ev in (CommEvent("all_reduce", 123, 8, "inter", 4), CommEvent("p2p", 5, 2, "intra"),
               CommEvent("cp_ring", 9, 2, "intra"), CommEvent("all_to_all", 7, 4, "inter", 2)):  # fmt: skip
        assert CommEvent.of_key(ev.key) == ev
        assert CommEvent.of_key(f"{ev.key}/overlapping=attention[h=8]/F/mbs=1/tp=2/bf16") == ev
    r = simulate(get_model("gpt2-345m"), get_cluster("dgx-h100").with_nodes(2),
                 Strategy(tp=2, pp=2, dp=4, num_micro_batches=1))  # fmt: skip
    kinds = dict(zip(r.flow.keys, r.flow.key_kinds, strict=True))
    comm = [k for k, kind in kinds.items() if kind not in ("compute", "optimizer")]
    assert comm and all(CommEvent.of_key(k).key == k for k in comm)
    assert all(CommEvent.of_key(k) is None for k, kind in kinds.items() if kind in ("compute", "optimizer"))
