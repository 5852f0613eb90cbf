"""A launcher killed outright (SIGKILL: no cleanup of its own) takes its ranks with it, leaves no output, and what it
could not remove (its launch directory, its network namespaces) goes at the next launch's start, never a live one's."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from distsim.infra import launch as launch_mod
from distsim.infra.launch import LAUNCH_DIR_PREFIX, OWNER_FILE, Emulation, netns_problem, remove_stale_launch_dirs

TINY = "gpt2-345m:seq=16,layers=2,hidden=32,heads=4,vocab=64,precision=fp32"
BOUND_S = 300.0  # generous (a loaded machine starts torch ranks slowly): polling ends as soon as the condition holds


def _poll(condition: Callable[[], bool], what: str, bound_s: float = BOUND_S) -> None:
    deadline = time.monotonic() + bound_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {bound_s:g} s: {what}")
        time.sleep(0.05)


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first), or None if the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _running(pid: int, start: str) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X") and fields[19] == start


def _descendants(root: int) -> dict[int, str]:
    """Every process below `root` (its children, theirs, ...), with its start time."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = (int(fields[1]), fields[19])
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, start) in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = start
                frontier.append(pid)
    return found


def _kill_leftovers(procs: dict[int, str]) -> None:
    for pid, start in procs.items():
        if _running(pid, start):
            os.kill(pid, signal.SIGKILL)


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")


# ------------------------------------------------------------------------------------------- the real launch
@pytest.mark.slow
@needs_proc
def test_a_killed_launcher_takes_its_ranks_writes_nothing_and_the_next_launch_removes_what_it_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`distsim execute` as the user runs it, on two emulated nodes joined by a shaped link where this machine has
    network namespaces (root, iproute2), else on loopback; its temporary folder is this test's own."""
    netns = netns_problem() is None
    nodes = ["--emulate-nodes", "2", "--link-bandwidth", "1gbit"] if netns else ["--emulate-nodes", "1",
                                                                                 "--procs-per-node", "2"]  # fmt: skip
    tmp, out, err = tmp_path / "tmp", tmp_path / "t.json", tmp_path / "launcher.err"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    with open(err, "wb") as stderr:
        launcher = subprocess.Popen([sys.executable, "-m", "distsim", "execute", "--model", TINY, "--cluster",
                                     "cpu-1x2", "--strategy", "1M2P1D", "--micro-batches", "1", *nodes,
                                     "--iterations", "100000", "--warmup", "0", "--out", str(out)],
                                    env=env, stdout=subprocess.DEVNULL, stderr=stderr)  # fmt: skip
    ranks: dict[int, str] = {}
    try:
        # up: rank 0 (on the launcher's stderr) has trained a step, so both ranks are running the job
        _poll(lambda: launcher.poll() is not None or "iteration 1/" in err.read_text(), "rank 0's first step")
        assert launcher.poll() is None, err.read_text()
        ranks = _descendants(launcher.pid)
        assert len(ranks) == 2, ranks  # the ranks themselves: `ip netns exec` runs them in its own process
        launch_dirs = list(tmp.glob(f"{LAUNCH_DIR_PREFIX}*"))
        assert len(launch_dirs) == 1
        assert (launch_dirs[0] / OWNER_FILE).read_text().split()[0] == str(launcher.pid)
        names = [f"distsim-{launcher.pid}-0", f"distsim-{launcher.pid}-1"] if netns else []
        assert all(n in _namespaces() for n in names)

        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        _poll(lambda: not any(_running(pid, start) for pid, start in ranks.items()), "the ranks to die")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        _kill_leftovers(ranks)

    # no rank runs any more, so nothing can still write: the abandoned run left no output, not even a temporary file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launcher.err", "tmp"]
    # what only the launcher could remove is still there: a live launcher's directory stands beside it
    assert launch_dirs[0].is_dir() and all(n in _namespaces() for n in names)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    live = launch_mod._make_launch_dir()  # this process's: running
    # the next launch (any job: a rank here only imports a module) removes them as it starts, and keeps the live one
    launch_mod.launch("distsim.infra.launch", {}, Emulation(2, 1, "1gbit") if netns else Emulation(1, 2), timeout_s=120)
    assert list(tmp.glob(f"{LAUNCH_DIR_PREFIX}*")) == [live]  # (torch keeps a cache of its own there)
    listed = _namespaces() if netns else ""
    assert not any(n in listed for n in names), listed


# ------------------------------------------------------------------------------------- each watch on its own
LAUNCHER = """
import os, subprocess, sys, time
fd = os.pipe()[0] if sys.argv[1] == "own" else int(sys.argv[1])
env = {**os.environ, "DISTSIM_LAUNCHER_FD": str(fd), "DISTSIM_LAUNCHER_PID": str(os.getpid())}
subprocess.Popen(sys.argv[2:], env=env, pass_fds=(fd,), start_new_session=True)
time.sleep(600)
"""

RANK = """
import os, time
from distsim.infra.launch import watch_launcher
watch_launcher()
print(os.getpid(), os.getppid(), flush=True)
time.sleep(600)
"""


def _watched_rank(pipe: str, *through: str) -> tuple[subprocess.Popen[str], int, int]:
    """A launcher (a plain Python process, as launch() passes the watch) and its rank started `through` a command;
    returns the launcher, the rank's pid and its parent's."""
    extra = (int(pipe),) if pipe.isdigit() else ()
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, pipe, *through, sys.executable, "-c", RANK],
                                stdout=subprocess.PIPE, text=True, pass_fds=extra)  # fmt: skip
    assert launcher.stdout is not None
    ready = select.select([launcher.stdout], [], [], BOUND_S)[0]  # the rank's watches are armed once it writes
    line = launcher.stdout.readline() if ready else ""
    if not line:
        launcher.kill()
        launcher.wait()
        raise AssertionError("the rank did not start")
    pid, ppid = map(int, line.split())
    return launcher, pid, ppid


@pytest.mark.slow
@needs_proc
def test_the_launchers_pipe_ends_a_rank_that_runs_below_another_process() -> None:
    """The rank's parent is a shell (which forks it, as `ip netns exec` would if it forked): its parent-death signal
    watches the shell, which outlives the launcher, so the end of the launcher's pipe alone ends the rank."""
    launcher, pid, ppid = _watched_rank("own", "sh", "-c", '"$@"; true', "sh")
    start = (_stat(pid) or [""] * 20)[19]
    try:
        assert ppid != launcher.pid
        launcher.kill()
        launcher.wait()
        _poll(lambda: not _running(pid, start), "the rank to die")
    finally:
        _kill_leftovers({pid: start})


@pytest.mark.slow
@needs_proc
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_the_parent_death_signal_ends_a_rank_whose_pipe_stays_open() -> None:
    """This test holds the pipe's write end too, so the launcher's death does not close it: the kernel's
    parent-death signal alone ends the rank; closing the pipe afterwards is the cleanup if it did not."""
    read, write = os.pipe()
    os.set_inheritable(read, True)
    try:
        launcher, pid, ppid = _watched_rank(str(read))
        start = (_stat(pid) or [""] * 20)[19]
        assert ppid == launcher.pid
        launcher.kill()
        launcher.wait()
        _poll(lambda: not _running(pid, start), "the rank to die")
    finally:
        os.close(read)
        os.close(write)


# ---------------------------------------------------------------------------------- which directories go
def _dir_owned_by(parent: Path, name: str, owner: str | None) -> Path:
    path = parent / f"{LAUNCH_DIR_PREFIX}{name}"
    path.mkdir()
    (path / "rank1.log").write_text("log\n")
    if owner is not None:
        (path / OWNER_FILE).write_text(owner)
    return path


@needs_proc
def test_only_directories_of_launchers_that_are_gone_are_removed(tmp_path: Path) -> None:
    me = os.getpid()
    my_start = launch_mod._start_time(me)
    done = subprocess.Popen(["true"])
    done.wait()
    zombie = subprocess.Popen(["true"])  # exited, not reaped yet: a zombie, not a launcher
    _poll(lambda: (_stat(zombie.pid) or ["?"])[0] == "Z", "the child to exit")
    try:
        live = _dir_owned_by(tmp_path, "live", f"{me} {my_start}\n")
        live_no_start = _dir_owned_by(tmp_path, "live-no-start", f"{me}\n")
        unowned = _dir_owned_by(tmp_path, "being-made", None)  # a launcher between mkdtemp and the owner file
        garbled = _dir_owned_by(tmp_path, "garbled", "not a pid\n")
        dead = _dir_owned_by(tmp_path, "dead", f"{done.pid} 1\n")
        reused = _dir_owned_by(tmp_path, "reused", f"{me} {int(my_start or 0) - 1}\n")  # another process, same pid
        zombied = _dir_owned_by(tmp_path, "zombie", f"{zombie.pid}\n")
        (tmp_path / "elsewhere").mkdir()
        link = tmp_path / f"{LAUNCH_DIR_PREFIX}link"
        link.symlink_to(_dir_owned_by(tmp_path / "elsewhere", "target", f"{done.pid}\n"))
        other = tmp_path / "other-dir"
        other.mkdir()
        (other / OWNER_FILE).write_text(f"{done.pid}\n")

        removed = remove_stale_launch_dirs(tmp_path)
    finally:
        zombie.wait()
    assert sorted(removed) == sorted([dead, reused, zombied])
    assert all(not p.exists() for p in removed)
    assert all(p.is_dir() for p in (live, live_no_start, unowned, garbled, other))
    assert link.is_symlink() and (link / OWNER_FILE).exists()  # never followed


def test_a_launch_directory_names_its_launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = launch_mod._make_launch_dir()
    assert path.parent == tmp_path and path.name.startswith(f"{LAUNCH_DIR_PREFIX}{os.getpid()}-")
    assert (path / OWNER_FILE).read_text().split()[0] == str(os.getpid())
    assert remove_stale_launch_dirs() == [] and path.is_dir()
