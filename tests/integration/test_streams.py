"""Standard output and pipes that fail: a full disk or device under stdout is one line and exit status 2 (nothing
left to fail again at exit); a reader that closes its end early ends that output quietly, the command goes on (its
summary still reaches stderr) and exits 0. Real subprocesses, real pipes, a real full filesystem."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from distsim.io.output import open_output
from tests.util import run_cli

SIM = ["simulate", "--model", "gpt2-cpu", "--cluster", "cpu-2x1", "--strategy", "1M2P1D", "--micro-batches", "4"]
BIG = ["simulate", "--model", "gpt2-345m", "--cluster", "distsim-testbed", "--strategy", "2M4P2D", "--micro-batches",
       "16", "--all-gpus"]  # fmt: skip
FULL = "distsim: error: standard output: cannot write (No space left on device)"


def _env(unbuffered: bool = False) -> dict[str, str]:
    """The environment with stdout block-buffered, as a user's shell runs Python (a failure shows when a buffer is
    flushed), or unbuffered (each write fails at once)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return {**env, "PYTHONUNBUFFERED": "1"} if unbuffered else env


def _distsim(args: list[str], stdout: object, unbuffered: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "distsim", *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          env=_env(unbuffered), timeout=300, check=False)  # fmt: skip


@pytest.mark.parametrize(("args", "unbuffered"), [([], False), (["--json"], True)], ids=["summary", "json-unbuffered"])
def test_stdout_on_a_full_device_is_one_line_and_exit_2(args: list[str], unbuffered: bool) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        done = _distsim([*SIM, *args], full, unbuffered)
    assert done.returncode == 2 and done.stderr.splitlines() == [FULL], done.stderr  # no "Exception ignored" at exit


def test_a_csv_on_stdout_redirected_to_a_full_disk_is_one_line_and_exit_2(full_dir: Path) -> None:
    with open(full_dir / "x.csv", "w") as target:
        done = _distsim([*SIM, "--csv", "-"], target)
    assert done.returncode == 2 and done.stderr.splitlines() == [FULL], done.stderr


def test_output_left_in_the_buffer_does_not_fail_again_at_exit(full_dir: Path) -> None:
    """Output still buffered when a command fails for another reason: its one line, and nothing from Python's flush
    of stdout at exit ("Exception ignored ... No space left on device", status 120)."""
    code = ("import sys; sys.stdout.write('pending'); from distsim.cli import main; "
            "main(['simulate', '--model', 'nope', '--cluster', 'cpu-2x1', '--strategy', '1M2P1D'])")  # fmt: skip
    with open(full_dir / "out.txt", "w") as target:
        done = subprocess.run([sys.executable, "-c", code], stdout=target, stderr=subprocess.PIPE, text=True,
                              env=_env(), timeout=300, check=False)  # fmt: skip
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("distsim: error: unknown model 'nope'")


def test_a_reader_that_closes_the_pipe_early_ends_the_csv_quietly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli([*BIG, "--csv", str(tmp_path / "t.csv")], capsys)
    assert code == 0 and (tmp_path / "t.csv").stat().st_size > 1 << 20, err  # far more than a pipe's buffer holds
    proc = subprocess.Popen([sys.executable, "-m", "distsim", *BIG, "--csv", "-"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # the reader goes away with the rest unread
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=300) == 0, err
    assert first.startswith("gpu,node,stream,kind")
    assert "iteration time" in err and "Traceback" not in err and "Exception" not in err and "Error" not in err


def test_a_fifo_whose_reader_goes_away_ends_that_output_quietly(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []

    def read_a_little() -> None:
        with open(fifo, "rb") as fh:
            received.append(fh.read(10))

    reader = threading.Thread(target=read_a_little)
    reader.start()
    reached_the_end = False
    with open_output(fifo) as fh:
        for _ in range(1000):
            fh.write("x" * 1024)  # 1 MiB, far more than the pipe holds: the reader is gone before the end
        reached_the_end = True
    reader.join(timeout=60)
    assert received == [b"x" * 10] and not reached_the_end
