"""What Perfetto itself reads from distsim's traces: no GPU is process 0 (Perfetto's idle process), old traces still
map their processes to the right GPUs, and a ``.pftrace`` decodes with Perfetto's own protobuf classes to exactly
the rows of the timeline's CSV.

The decoder in test_trace_output.py is ours, so it would share a misreading of the format with the writer; here the
``perfetto`` package's generated ``perfetto_trace_pb2`` decodes the file (skipped where it is not installed), and
any field it does not know (a wrong field number, a field of another message) fails the test.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from distsim.cli import main
from distsim.io.files import load_trace, write_chrome_trace
from distsim.io.trace import chrome_gpus, chrome_rows

ROOT = Path(__file__).resolve().parents[2]
OLD_TRACE = ROOT / "traces" / "gpt2-cpu-1x2-1M2P1D-1f1b-M2"  # committed with pid = GPU (GPU 0 in pid 0)
SIMULATE = ["simulate", "--model", "gpt2-345m:layers=4", "--cluster", "dgx-a100", "--nodes", "2", "--strategy",
            "2M2P4D", "--micro-batches", "3", "--all-gpus"]  # fmt: skip


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated iteration of 16 GPUs written as .pftrace with its .csv, and as .json (every GPU's rows)."""
    out = tmp_path_factory.mktemp("perfetto")
    for files in (["--trace", str(out / "t.pftrace"), "--csv", str(out / "t.csv")], ["--trace", str(out / "t.json")]):
        with pytest.raises(SystemExit) as exc:
            main([*SIMULATE, *files])
        assert not exc.value.code
    return out


# ------------------------------------------------------------------------------------------------ JSON process ids
def test_json_traces_number_gpus_from_pid_1(written: Path) -> None:
    events = json.loads((written / "t.json").read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert 0 not in {e["pid"] for e in events}
    assert names[1].startswith("GPU 0 ") and all(names[pid].startswith(f"GPU {pid - 1} ") for pid in names)
    assert chrome_gpus(events) == {pid: pid - 1 for pid in names}


def test_old_and_new_chrome_traces_give_the_same_gpus(tmp_path: Path) -> None:
    trace = load_trace(OLD_TRACE.with_suffix(".json"))
    median = trace.timeline(trace.median_index(), gpus_per_node=1)
    old = json.loads(OLD_TRACE.with_suffix(".chrome.json").read_text())
    assert {e["pid"] for e in old["traceEvents"]} == {0, 1}  # written before GPUs were numbered from pid 1
    write_chrome_trace(tmp_path / "new.json", median, "measured")
    new = json.loads((tmp_path / "new.json").read_text())
    assert {e["pid"] for e in new["traceEvents"]} == {1, 2}
    key = ["gpu", "stream", "start_s", "name"]
    old_rows, new_rows = (chrome_rows(d).sort_values(key, ignore_index=True) for d in (old, new))
    pd.testing.assert_frame_equal(old_rows, new_rows, check_exact=False, atol=1e-8, rtol=0)
    df = median.df.assign(start_s=median.df.start_s - median.df.start_s.min())
    assert sorted(old_rows.gpu.tolist()) == sorted(df.gpu.tolist()) and set(old_rows.gpu) == {0, 1}


# ----------------------------------------------------------------------------------- .pftrace, Perfetto's decoder
def _unknown(message: Any, where: str = "Trace") -> list[str]:
    """Paths of every field a message and the messages in it hold that its proto does not define."""
    try:
        from google.protobuf.unknown_fields import UnknownFieldSet

        unknown = [f.field_number for f in UnknownFieldSet(message)]
    except ImportError:  # protobuf < 4.21: the message gives them itself
        unknown = [f.field_number for f in message.UnknownFields()]
    out = [f"{where}.<field {n}>" for n in unknown]
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if hasattr(value, "ListFields"):
            values = [value]
        elif field.message_type.GetOptions().map_entry:
            values = list(value.values())
        else:  # a repeated message field
            values = list(value)
        for i, v in enumerate(values):
            if hasattr(v, "ListFields"):
                out += _unknown(v, f"{where}.{field.name}[{i}]" if len(values) > 1 else f"{where}.{field.name}")
    return out


def _slices(trace: Any) -> tuple[pd.DataFrame, dict[int, int]]:
    """Begin/end pairs per track as rows (gpu, stream, name, kind, start_ns, end_ns), and pid -> GPU."""
    names: dict[int, str] = {}
    categories: dict[int, str] = {}
    tracks: dict[int, tuple[int, str]] = {}
    pids: dict[int, int] = {}
    open_: dict[int, list[tuple[int, Any]]] = defaultdict(list)
    rows = []
    for packet in trace.packet:
        if packet.HasField("interned_data"):
            names |= {e.iid: e.name for e in packet.interned_data.event_names}
            categories |= {e.iid: e.name for e in packet.interned_data.event_categories}
        if packet.HasField("track_descriptor"):
            d = packet.track_descriptor
            if d.HasField("process"):
                gpu = int(re.match(r"GPU (\d+) ", d.process.process_name).group(1))
                pids[d.process.pid] = gpu
                tracks[d.uuid] = (gpu, "")
            elif d.HasField("thread"):
                assert d.thread.pid in pids, "a thread track after its process"
                tracks[d.uuid] = (pids[d.thread.pid], d.thread.thread_name.split(" (")[0])
        if not packet.HasField("track_event"):
            continue
        event = packet.track_event
        if event.type == event.TYPE_SLICE_BEGIN:
            open_[event.track_uuid].append((packet.timestamp, event))
        elif event.type == event.TYPE_SLICE_END:
            begin, b = open_[event.track_uuid].pop()
            gpu, stream = tracks[event.track_uuid]
            (category,) = b.category_iids
            rows.append((gpu, stream, names[b.name_iid], categories[category], begin, packet.timestamp))
    assert not any(open_.values()), "a slice begins and never ends"
    return pd.DataFrame(rows, columns=["gpu", "stream", "name", "kind", "start_ns", "end_ns"]), pids


def _csv_slices(path: Path) -> pd.DataFrame:
    """The CSV's rows as the slices a trace should hold: names with ' mbN', integer ns from the first start."""
    df = pd.read_csv(path)
    t0 = df.start_s.min()
    name = df.name.where(df.microbatch < 0, df.name + " mb" + df.microbatch.astype(str))
    return pd.DataFrame({
        "gpu": df.gpu, "stream": df.stream, "name": name, "kind": df.kind,
        "start_ns": np.rint((df.start_s - t0) * 1e9).astype(np.int64),
        "end_ns": np.rint((df.end_s - t0) * 1e9).astype(np.int64),
    })  # fmt: skip


def test_perfetto_decodes_the_pftrace_to_the_rows_of_the_csv(written: Path) -> None:
    pb2 = pytest.importorskip(
        "perfetto.protos.perfetto.trace.perfetto_trace_pb2",
        reason="Perfetto's protobuf classes come with the perfetto package (pip install perfetto)",
    )
    trace = pb2.Trace()
    trace.ParseFromString((written / "t.pftrace").read_bytes())
    assert _unknown(trace) == []
    got, pids = _slices(trace)
    assert 0 not in pids and sorted(pids.values()) == list(range(16))
    want = _csv_slices(written / "t.csv")
    assert len(got) == len(want) > 1000
    key = list(want.columns)
    got = got.sort_values(key, ignore_index=True)
    want = want.sort_values(key, ignore_index=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    assert set(got.stream) >= {"compute", "tp", "p2p", "dp"} and set(got.gpu) == set(range(16))
