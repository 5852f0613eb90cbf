"""Outputs never harm what is at their path: devices and FIFOs are streamed to, links followed, files replaced whole."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from distsim.io.output import OutputError, check_output, open_output
from tests.util import run_cli as run

REPO = Path(__file__).resolve().parents[2]
SIM = ["simulate", "--model", "gpt2-cpu", "--cluster", "cpu-2x1", "--strategy", "1M2P1D", "--micro-batches", "4",
       "--profile", str(REPO / "profiles" / "cpu-gloo.json")]  # fmt: skip


def _mode(path: Path) -> int:
    return os.lstat(path).st_mode


def test_a_new_or_regular_file_is_written_whole_and_keeps_its_permissions(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    with open_output(target) as fh:
        fh.write("first")
    assert target.read_text() == "first"
    target.chmod(0o640)
    with open_output(target) as fh:
        fh.write("second")
    assert target.read_text() == "second" and stat.S_IMODE(_mode(target)) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), open_output(target) as fh:
        fh.write("half")
        raise RuntimeError("the writer failed")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_a_symlink_is_followed_and_stays_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with open_output(link) as fh:
        fh.write("new")
    assert stat.S_ISLNK(_mode(link)) and real.read_text() == "new"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "made.json")
    with open_output(dangling) as fh:
        fh.write("made")
    assert stat.S_ISLNK(_mode(dangling)) and (tmp_path / "made.json").read_text() == "made"


def test_a_fifo_is_streamed_to_and_stays_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    with open_output(fifo) as fh:
        fh.write("through the pipe")
    reader.join(timeout=60)
    assert received == [b"through the pipe"] and stat.S_ISFIFO(_mode(fifo))


def test_a_character_device_is_written_to_not_replaced(tmp_path: Path) -> None:
    with open_output("/dev/null") as fh:
        fh.write("gone")
    assert stat.S_ISCHR(_mode(Path("/dev/null")))
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    node = tmp_path / "null-copy"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a copy of /dev/null
    link = tmp_path / "stdout-like"
    link.symlink_to(node)
    for path in (node, link):
        with open_output(path) as fh:
            fh.write("x" * 100_000)
    assert stat.S_ISCHR(_mode(node)) and stat.S_ISLNK(_mode(link))


def test_a_full_device_is_one_error_and_stays_a_device() -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with pytest.raises(OutputError, match="No space left on device"), open_output("/dev/full") as fh:
        fh.write("x" * 100_000)
    assert stat.S_ISCHR(_mode(Path("/dev/full")))


@pytest.mark.parametrize(
    ("path", "figure", "message"),
    [
        ("{tmp}/missing/out.json", False, "directory {tmp}/missing does not exist"),
        ("{tmp}", False, "is a directory"),
        ("{tmp}/out.xyz", True, "cannot write a figure as 'xyz'"),
        ("{tmp}/out", True, "cannot write a figure as 'a file without extension'"),
    ],
)
def test_check_output_names_the_problem_before_any_work(tmp_path: Path, path: str, figure: bool, message: str) -> None:
    with pytest.raises(OutputError, match=message.format(tmp=tmp_path)):
        check_output(path.format(tmp=tmp_path), "--out", figure=figure)


def test_check_output_refuses_streams_where_a_file_is_needed(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="needs a file name"):
        check_output("-", "--out", stream_ok=False)
    with pytest.raises(OutputError, match="needs a regular file"):
        check_output("/dev/null", "--out", stream_ok=False)
    check_output(tmp_path / "new.json", "--out", stream_ok=False)  # fine


def test_simulate_writes_to_dev_null_and_a_fifo_without_replacing_them(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    done = subprocess.run([sys.executable, "-m", "distsim", *SIM, "--trace", str(fifo), "--csv", "/dev/null"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    reader.join(timeout=60)
    assert done.returncode == 0, done.stderr
    assert stat.S_ISFIFO(_mode(fifo)) and stat.S_ISCHR(_mode(Path("/dev/null")))
    assert json.loads(received[0])["traceEvents"]


def test_csv_to_stdout_moves_the_summary_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([*SIM, "--csv", "-"], capsys)
    assert code == 0, err
    assert out.splitlines()[0].startswith("gpu,node,stream,kind") and "iteration time" in err
    assert "iteration time" not in out


def test_two_outputs_on_stdout_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run([*SIM, "--csv", "-", "--json"], capsys)
    assert code == 2 and "--csv and --json would both write to standard output" in err


def test_json_into_a_closed_pipe_is_quiet() -> None:
    cmd = f"{sys.executable} -m distsim {' '.join(SIM)} --trace - | head -c 10"
    done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert done.stdout.startswith("{") and len(done.stdout) == 10
    assert done.stderr.strip() == "" or "iteration time" in done.stderr  # the summary only, no traceback
    assert "Traceback" not in done.stderr and "Error" not in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        [*SIM, "--trace", "{tmp}/t.json", "--csv", "{tmp}/t.csv", "--plot", "{tmp}/t.xyz"],
        ["search", "grid", "--model", "bert-exlarge", "--cluster", "distsim-a10", "--global-batch", "16",
         "--csv", "{tmp}/t.csv", "--plan-out", "{tmp}/t.plan.yaml", "--plot", "{tmp}/t.xyz"],
        ["search", "dapple", "--model", "bert-large", "--cluster", "dapple-a", "--global-batch", "16",
         "--plan-out", "{tmp}/t.plan.yaml", "--trace", "{tmp}/t.json", "--plot", "{tmp}/t.xyz"],
        ["validate", "--trace", str(REPO / "traces" / "gpt2-cpu-1x2-1M2P1D-1f1b-M4.json"), "--plot", "{tmp}/t.xyz"],
    ],
)  # fmt: skip
def test_a_bad_output_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    code, _, err = run([a.format(tmp=tmp_path) for a in args], capsys)
    assert code == 2 and "cannot write a figure as 'xyz'" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_dev_stdout_is_standard_output() -> None:
    """`--csv /dev/stdout` is `--csv -`: the table on stdout, the summary on stderr (not mixed into the table)."""
    if not Path("/dev/stdout").exists():
        pytest.skip("no /dev/stdout here")
    done = subprocess.run([sys.executable, "-m", "distsim", *SIM, "--csv", "/dev/stdout"], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("gpu,node,stream") and "iteration time" not in done.stdout
    assert "iteration time" in done.stderr


def test_a_csv_gz_name_writes_the_same_table_compressed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gzip

    plain, packed = tmp_path / "t.csv", tmp_path / "t.csv.gz"
    for path in (plain, packed):
        code, _, err = run([*SIM, "--csv", str(path), "--all-gpus"], capsys)
        assert code == 0, err
    assert packed.read_bytes()[:2] == b"\x1f\x8b" and gzip.decompress(packed.read_bytes()) == plain.read_bytes()
