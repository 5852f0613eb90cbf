"""A measured timeline's key, bytes, peer and group columns are the simulated timeline's for the same plan.

The rows are matched by (gpu, kind, name, micro-batch): the executor and the simulator name events alike, but not
always one row for one row. A measured block is split around the tensor-parallel all-reduces it runs (compute before,
between and after them), and the LM head's vocab-parallel cross-entropy all-reduces three values per token in three
collectives where the simulator has one all-reduce of the three; so compute rows are compared by key, and
communication rows by their total bytes per (gpu, kind, name, micro-batch, key), with their peers and groups.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from distsim import Strategy, get_cluster, simulate  # noqa: E402
from distsim.core.models import get_model  # noqa: E402
from distsim.core.partition import ranges  # noqa: E402
from distsim.core.placement import Placement  # noqa: E402
from distsim.core.schedules import build_schedule  # noqa: E402
from distsim.executor.runtime import Runtime  # noqa: E402
from distsim.io.trace import Trace  # noqa: E402
from distsim.sim.timeline import COMM_COLUMNS, COMM_KINDS, COMPUTE_KINDS  # noqa: E402

TINY = "gpt2-345m:seq=16,layers=2,hidden=32,heads=4,vocab=64,precision=fp32"
Match = tuple[int, str, str, int]
"""(gpu, kind, name, micro-batch) of a row."""


def _device_rows(df: Any) -> Any:
    """Rows of device work (not the host's launch rows), with text columns as str."""
    df = df[df["stream"].astype(str) != "host"].copy()
    for c in ("kind", "name", "key", "group"):
        df[c] = df[c].astype(str)
    return df


def _comm(df: Any) -> dict[tuple[Match, str], tuple[int, set[int], set[str]]]:
    """(row, key) -> (bytes summed, peers, groups) of the communication rows."""
    out: dict[tuple[Match, str], tuple[int, set[int], set[str]]] = {}
    comm = df[df["kind"].isin(COMM_KINDS)]
    for g, k, n, m, key, b, p, grp in zip(comm["gpu"], comm["kind"], comm["name"], comm["microbatch"], comm["key"],
                                          comm["bytes"], comm["peer"], comm["group"], strict=True):  # fmt: skip
        total, peers, groups = out.get(((int(g), k, n, int(m)), key), (0, set(), set()))
        out[((int(g), k, n, int(m)), key)] = (total + int(b), peers | {int(p)}, groups | {grp})
    return out


def _keys(df: Any) -> set[tuple[Match, str]]:
    """(row, key) of every row."""
    return {((int(g), k, n, int(m)), key) for g, k, n, m, key in
            zip(df["gpu"], df["kind"], df["name"], df["microbatch"], df["key"], strict=True)}  # fmt: skip


def assert_columns_are_the_simulators(trace_path: Path, iteration: int = 0) -> None:
    """A measured iteration's :data:`COMM_COLUMNS` against the simulated timeline of its plan (see the module)."""
    trace = Trace.from_dict(json.loads(trace_path.read_text()))
    plan = trace.plan
    model, cluster = get_model(plan["model"]), get_cluster(plan["cluster"]).with_nodes(plan["nodes"])
    result = simulate(model, cluster, Strategy.from_str(plan["strategy"]))
    sim = _device_rows(result.timeline.expand().df)
    got = _device_rows(trace.timeline(iteration, cluster.gpus_per_node).df)
    compute = got[got["kind"].isin(COMPUTE_KINDS)]
    assert (compute["bytes"] == 0).all() and (compute["peer"] == -1).all() and (compute["group"] == "").all()
    assert _keys(compute) == _keys(sim[sim["kind"].isin(COMPUTE_KINDS)])  # a split block's pieces: its key
    assert _comm(got) == _comm(sim) and len(_comm(got)) > 0
    assert set(got["key"]) <= set(result.cost_table()["event"]) | {""}  # the keys join the cost table


def _execute(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "distsim", "execute", *args], capture_output=True, text=True,
                          timeout=900, env=dict(os.environ))  # fmt: skip


@pytest.mark.slow
def test_a_tensor_parallel_run_records_the_simulators_columns_and_its_table(tmp_path: Path) -> None:
    """2 tensor-parallel ranks (the pipeline's transfers and the tied embedding's all-reduce are checked in
    tests/integration/test_executor.py's 1M2P1D run)."""
    out, table = tmp_path / "t.json", tmp_path / "t.parquet"
    run = _execute("--model", TINY, "--cluster", "cpu-1x2", "--strategy", "2M1P1D", "--micro-batches", "2",
                   "--micro-batch-size", "2", "--emulate-nodes", "1", "--procs-per-node", "2", "--iterations", "1",
                   "--warmup", "0", "--out", str(out), "--table", str(table))  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert_columns_are_the_simulators(out)
    trace = Trace.from_dict(json.loads(out.read_text()))
    import pandas as pd

    read = pd.read_parquet(table)
    measured = trace.timeline(trace.median_index(), 2).df
    assert list(read.columns) == list(measured.columns) and set(COMM_COLUMNS) <= set(read.columns)
    assert {c: str(read[c].dtype) for c in COMM_COLUMNS} == {"key": "category", "bytes": "int64", "peer": "int32",
                                                             "group": "category"}  # fmt: skip
    tp = read[read["kind"].astype(str) == "tp_allreduce"]
    assert len(tp) > 0 and set(tp["group"].astype(str)) == {"0-1"} and (tp["bytes"] > 0).all()


def test_a_trace_without_the_columns_reads_with_their_defaults() -> None:
    shipped = json.loads(Path("traces/gpt2-cpu-1x2-1M2P1D-1f1b-M4.json").read_text())
    assert not set(COMM_COLUMNS) & set(shipped["iterations"][0]["columns"])  # written before them
    df = Trace.from_dict(shipped).timeline(0, 2).df
    assert (df["key"] == "").all() and (df["bytes"] == 0).all() and (df["peer"] == -1).all()
    assert (df["group"] == "").all()
    assert {c: str(df[c].dtype) for c in COMM_COLUMNS} == {"key": "category", "bytes": "int64", "peer": "int32",
                                                           "group": "category"}  # fmt: skip
    again = Trace.from_dict(json.loads(json.dumps(Trace.from_dict(shipped).to_dict()))).timeline(0, 2).df
    assert again.equals(df)  # written with the columns, read back the same


def test_a_data_parallel_ranks_buckets_say_what_the_simulators_do() -> None:
    """Each gradient bucket's row (key, bytes, peer, group) as the simulator's, from a one-process runtime of rank 0
    of two data-parallel ranks (no collective runs: the real run is tests/integration/test_executor.py's)."""
    model, cluster = get_model(TINY), get_cluster("cpu-1x2")
    strategy = Strategy.from_str("1M1P2D", micro_batch_size=2, num_micro_batches=2, grad_sync="ddp",
                                 bucket_cap_mb=0.02)  # fmt: skip
    strategy = strategy.with_(partition=(model.num_layers,))
    runtime = Runtime(model, strategy, Placement(strategy, cluster), build_schedule(strategy),
                      ranges(strategy.partition), 0, {}, torch.float32, torch.device("cpu"))  # fmt: skip
    assert len(runtime.buckets) > 1
    result = simulate(model, cluster, strategy)
    sim = _device_rows(result.timeline.expand().df)
    sim = sim[(sim["gpu"] == 0) & (sim["kind"] == "dp_allreduce")]
    want = {n: (k, int(b), int(p), g) for n, k, b, p, g in
            zip(sim["name"], sim["key"], sim["bytes"], sim["peer"], sim["group"], strict=True)}  # fmt: skip
    assert {b.name: runtime._bucket_info(b) for b in runtime.buckets} == want
    assert runtime.keys.optimizer in set(result.cost_table()["event"])
