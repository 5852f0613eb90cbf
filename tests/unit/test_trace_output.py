"""Trace formats by file name (JSON, gzip JSON, Perfetto protobuf), streaming --all-gpus exports, the size warning."""

from __future__ import annotations

import gzip
import json
import os
import stat
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from distsim import Strategy, get_cluster, get_model, simulate
from distsim.io import perfetto as pf
from distsim.io.files import write_chrome_trace, write_timeline_csv
from distsim.io.trace_export import TraceSource, estimate, iter_chrome_events, trace_format
from distsim.sim.timeline import Timeline
from tests.util import run_cli as run


@pytest.fixture(scope="module")
def timeline() -> Timeline:
    """16 GPUs, 4 simulated, each standing for 4 (a symmetric simulation)."""
    cluster = replace(get_cluster("dgx-a100"), nodes=2)
    r = simulate(get_model("gpt2-345m"), cluster, Strategy.from_str("2M4P2D", num_micro_batches=4))
    assert not r.timeline.is_expanded and len(r.timeline.gpus) == 16
    return r.timeline


def _events(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)["traceEvents"]


# ------------------------------------------------------------------------------- a protobuf wire-format decoder
def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def _fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) of every field of a message: ints for varints and fixed, bytes when length-delimited."""
    out: list[tuple[int, int | bytes]] = []
    i = 0
    while i < len(buf):
        tag, i = _varint(buf, i)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, i = _varint(buf, i)
            out.append((number, value))
        elif wire == 2:
            size, i = _varint(buf, i)
            out.append((number, buf[i : i + size]))
            i += size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            out.append((number, int.from_bytes(buf[i : i + width], "little")))
            i += width
        else:
            raise AssertionError(f"wire type {wire} at byte {i}")
    assert i == len(buf)
    return out


def _one(fields: list[tuple[int, Any]], number: int, default: Any = None) -> Any:
    values = [v for n, v in fields if n == number]
    assert len(values) <= 1, number
    return values[0] if values else default


def _decode_trace(data: bytes) -> dict[str, Any]:
    """Tracks (uuid -> (process name, thread name)) and slices ((process, thread), name, category, args, ts, dur) of
    a Perfetto trace, checking the sequence and interning rules it relies on."""
    packets = [v for n, v in _fields(data) if n == 1]
    assert len(packets) == len(_fields(data)), "a Trace holds only packets (field 1)"
    interned: dict[int, dict[int, str]] = {1: {}, 2: {}, 3: {}}
    processes: dict[int, str] = {}
    tracks: dict[int, tuple[str, str]] = {}
    open_slices: dict[int, list[tuple[int, list[tuple[int, Any]]]]] = {}
    slices = []
    for index, raw in enumerate(packets):
        p = _fields(raw)
        if index == 0:
            assert _one(p, 13) == 1 and _one(p, 87) == 1, "first packet clears the incremental state"
        if _one(p, 12) is not None:  # interned data
            for number, entry in _fields(_one(p, 12)):
                e = _fields(entry)
                interned[number][_one(e, 1)] = _one(e, 2).decode()
        if _one(p, 60) is not None:  # track descriptor
            d = _fields(_one(p, 60))
            if _one(d, 3) is not None:
                proc = _fields(_one(d, 3))
                processes[_one(d, 1)] = _one(proc, 6).decode()
            if _one(d, 4) is not None:
                thread = _fields(_one(d, 4))
                assert _one(d, 5) in processes and _one(thread, 2) != _one(thread, 1)
                tracks[_one(d, 1)] = (processes[_one(d, 5)], _one(thread, 5).decode())
        if _one(p, 11) is not None:  # track event
            assert _one(p, 10) == 1, "every event is on sequence 1, whose interned names it uses"
            e = _fields(_one(p, 11))
            uuid, ts = _one(e, 11), _one(p, 8)
            assert uuid in tracks, "a track is described before its events"
            if _one(e, 9) == pf.TYPE_SLICE_BEGIN:
                assert _one(p, 13) == pf.SEQ_NEEDS_INCREMENTAL_STATE
                open_slices.setdefault(uuid, []).append((ts, e))
            else:
                assert _one(e, 9) == pf.TYPE_SLICE_END
                begin, b = open_slices[uuid].pop()
                assert ts >= begin
                args = {}
                for number, a in b:
                    if number == 4:
                        fields = _fields(a)
                        args[interned[3][_one(fields, 1)]] = _one(fields, 4)
                name, category = interned[2][_one(b, 10)], interned[1][_one(b, 3)]
                slices.append((tracks[uuid], name, category, args, begin, ts - begin))
    assert not any(open_slices.values()), "every slice ends"
    return {"processes": processes, "tracks": tracks, "slices": slices}


def _json_slices(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    process = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    thread = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    return [((process[e["pid"]], thread[e["pid"], e["tid"]]), e["name"], e["cat"], e["args"], e["ts"], e["dur"])
            for e in events if e["ph"] == "X"]  # fmt: skip


# ------------------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize(
    ("name", "fmt"),
    [("t.json", "json"), ("t.trace.json", "json"), ("t.JSON.GZ", "json.gz"), ("t.pftrace", "pftrace"),
     ("t.perfetto-trace", "pftrace"), ("-", "json"), ("t.txt", "json")],
)  # fmt: skip
def test_the_format_follows_the_file_name(name: str, fmt: str) -> None:
    assert trace_format(name) == fmt


def test_varints_match_the_protobuf_encoding() -> None:
    assert pf.varint(0) == b"\x00" and pf.varint(1) == b"\x01" and pf.varint(300) == b"\xac\x02"
    assert pf.varint(-1) == b"\xff" * 9 + b"\x01"  # int64 -1: ten bytes
    values = np.array([0, 1, 127, 128, 300, 2**28, 2**35 - 1, 2**62, -1, -300], dtype=np.int64)
    matrix, lengths = pf.varints(values)
    assert [bytes(row[:n]) for row, n in zip(matrix, lengths, strict=True)] == [pf.varint(int(v)) for v in values]
    rec = (
        pf.Records(3)
        .uint_field(5, np.array([1, 300, 7]))
        .message(7, pf.Records(3).const(b"ab"), present=np.array([1, 0, 1]))
    )
    data, _ = rec.build()
    assert data.tobytes() == b"\x28\x01\x3a\x02ab" + b"\x28\xac\x02" + b"\x28\x07\x3a\x02ab"


def test_the_events_of_every_gpu_stream_without_expanding(timeline: Timeline) -> None:
    expanded = list(iter_chrome_events(timeline.expand()))
    assert list(iter_chrome_events(timeline, expand=True)) == expanded
    assert len([e for e in expanded if e["ph"] == "X"]) == len(timeline.expand().df) == 4 * len(timeline.df)
    assert TraceSource(timeline, expand=True).events == len(timeline.expand().df)


def test_json_and_gzip_json_hold_the_same_events(timeline: Timeline, tmp_path: Path) -> None:
    for expand in (False, True):
        write_chrome_trace(tmp_path / "t.json", timeline, "title", expand=expand)
        write_chrome_trace(tmp_path / "t.json.gz", timeline, "title", expand=expand)
        assert (tmp_path / "t.json.gz").read_bytes()[:2] == b"\x1f\x8b"
        plain = _events(tmp_path / "t.json")
        assert _events(tmp_path / "t.json.gz") == plain == list(iter_chrome_events(timeline, expand=expand))
        assert json.loads((tmp_path / "t.json").read_text())["otherData"] == {"title": "title"}


def test_event_dicts_are_still_written_as_json(timeline: Timeline, tmp_path: Path) -> None:
    events = list(iter_chrome_events(timeline))
    write_chrome_trace(tmp_path / "d.json.gz", iter(events), "title")
    assert _events(tmp_path / "d.json.gz") == events


def test_a_pftrace_decodes_to_the_tracks_and_slices_of_the_json(timeline: Timeline, tmp_path: Path) -> None:
    for expand in (False, True):
        write_chrome_trace(tmp_path / "t.json", timeline, "title", expand=expand)
        write_chrome_trace(tmp_path / "t.pftrace", timeline, "title", expand=expand)
        trace = _decode_trace((tmp_path / "t.pftrace").read_bytes())
        events = _events(tmp_path / "t.json")
        gpus = 16 if expand else 4
        assert len(trace["processes"]) == gpus
        assert set(trace["processes"].values()) == {e["args"]["name"] for e in events if e["name"] == "process_name"}
        streams = [e["args"]["name"] for e in events if e["name"] == "thread_name"]
        assert len(trace["tracks"]) == len(streams) == gpus * 5  # host, compute, tp, p2p, dp
        assert sorted(t for _, t in trace["tracks"].values()) == sorted(streams)
        want = sorted(_json_slices(events), key=lambda s: (s[0], s[4], s[1]))
        got = sorted(trace["slices"], key=lambda s: (s[0], s[4], s[1]))
        assert len(got) == len(want) == (len(timeline.df) * (4 if expand else 1))
        for (track, name, cat, args, ts_ns, dur_ns), (j_track, j_name, j_cat, j_args, ts_us, dur_us) in zip(
            got, want, strict=True
        ):
            assert (track, name, cat, args) == (j_track, j_name, j_cat, j_args)
            assert abs(ts_ns - ts_us * 1e3) <= 1 and abs(dur_ns - dur_us * 1e3) <= 2


def test_overlapping_slices_of_a_stream_go_to_separate_tracks(tmp_path: Path) -> None:
    df = pd.DataFrame({
        "gpu": [0, 0, 0], "node": [0, 0, 0], "stream": ["p2p", "p2p", "p2p"], "kind": ["p2p"] * 3,
        "name": ["send a", "send b", "send c"], "layer": [-1, -1, -1], "stage": [0, 0, 0], "microbatch": [0, 1, 2],
        "start_s": [0.0, 1.0, 2.5], "end_s": [2.0, 3.0, 2.6],
    })  # fmt: skip
    write_chrome_trace(tmp_path / "m.pftrace", Timeline(df, gpus_per_node=8), "measured")
    trace = _decode_trace((tmp_path / "m.pftrace").read_bytes())
    assert sorted(t for _, t in trace["tracks"].values()) == ["p2p", "p2p (2)"]
    lanes = {name: track[1] for track, name, *_ in trace["slices"]}
    assert lanes == {"send a mb0": "p2p", "send b mb1": "p2p (2)", "send c mb2": "p2p"}


def test_the_csv_of_every_gpu_is_the_expanded_timeline(timeline: Timeline, tmp_path: Path) -> None:
    write_timeline_csv(tmp_path / "t.csv", timeline, expand=True)
    assert (tmp_path / "t.csv").read_text() == timeline.expand().df.to_csv(index=False)


def test_a_warning_before_a_trace_too_big_for_the_ui(timeline: Timeline, tmp_path: Path) -> None:
    lines: list[str] = []
    for name in ("t.json", "t.json.gz", "t.pftrace"):
        est = estimate(TraceSource(timeline, expand=True), trace_format(name))
        write_chrome_trace(
            tmp_path / name, timeline, "t", expand=True, report=lines.append, warn_bytes=est.loaded_bytes / 2
        )
        written = (tmp_path / name).stat().st_size
        low, high = (0.5, 2.0) if name.endswith(".gz") else (0.9, 1.1)  # gzip: from one sample's ratio
        assert low < est.bytes / written < high, (name, est.bytes, written)
    assert len(lines) == 3
    assert "3,464 events" in lines[0] and "t.pftrace" in lines[0] and "t.json.gz" in lines[0]
    assert "dropping --all-gpus (866 events" in lines[0]
    assert "t.pftrace" in lines[1] and "trace_processor --httpd" in lines[2]
    write_chrome_trace(tmp_path / "t.json", timeline, "t", expand=True, report=lines.append)
    assert len(lines) == 3  # below the default threshold: quiet


def test_progress_is_reported_in_events(timeline: Timeline, tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    write_chrome_trace(tmp_path / "t.pftrace", timeline, "t", expand=True, progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (3464, 3464)


@pytest.mark.parametrize("name", ["t.json", "t.json.gz", "t.pftrace"])
def test_every_format_streams_to_a_fifo_and_to_a_device(timeline: Timeline, tmp_path: Path, name: str) -> None:
    write_chrome_trace(tmp_path / name, timeline, "t", expand=True)
    fifo = tmp_path / "pipe" / name
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    write_chrome_trace(fifo, timeline, "t", expand=True)
    reader.join(timeout=60)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    if name.endswith(".gz"):  # the same JSON; gzip headers may differ only in the name field, not written
        assert gzip.decompress(received[0]) == gzip.decompress((tmp_path / name).read_bytes())
    else:
        assert received[0] == (tmp_path / name).read_bytes()
    null = tmp_path / f"null-{name}"
    null.symlink_to("/dev/null")  # a name that picks the format, for a device
    write_chrome_trace(null, timeline, "t", expand=True)
    assert stat.S_ISCHR(os.stat(null).st_mode)


def test_a_trace_on_standard_output(timeline: Timeline, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    write_chrome_trace("-", timeline, "t")
    out = capsysbinary.readouterr().out
    assert json.loads(out)["traceEvents"] == list(iter_chrome_events(timeline))


def test_simulate_writes_every_format_for_every_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "gpt2-345m", "--cluster", "dgx-a100", "--nodes", "2", "--strategy", "2M4P2D",
            "--micro-batches", "4", "--all-gpus"]  # fmt: skip
    for name in ("s.json", "s.json.gz", "s.pftrace"):
        code, _, err = run([*args, "--trace", str(tmp_path / name)], capsys)
        assert code == 0, err
        assert "warning" not in err and "written" not in err  # small and quick: no warning, no progress
    trace = _decode_trace((tmp_path / "s.pftrace").read_bytes())
    assert len(trace["slices"]) == len([e for e in _events(tmp_path / "s.json") if e["ph"] == "X"]) == 3464
    assert _events(tmp_path / "s.json") == _events(tmp_path / "s.json.gz")


def test_help_names_the_formats(capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["simulate"], ["search", "dapple"], ["search", "grid"]):
        code, out, _ = run([*command, "--help"], capsys)
        assert code == 0 and "*.json.gz" in out and "*.pftrace" in out, command


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
