"""Launch the ranks of a distributed job on one machine, emulating several nodes.

Each rank is a Python process given the environment torchrun would give it (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT). With a link bandwidth, and as root on Linux, each emulated
node runs in its own network namespace; the two namespaces are joined by a veth pair whose both ends are shaped with
``tc qdisc ... tbf``, so traffic between nodes crosses a slower link while traffic inside a node stays on the local
stack. The namespaces are removed on exit, on failure and on Ctrl-C; stale ones left by a killed launcher are removed
at the next start.

The launcher watches its ranks: if one exits with an error the others are stopped and the error (the rank's last
message) is raised; if they are not done within the timeout they are stopped and a timeout is raised.

The ranks watch their launcher: a launcher that dies without cleaning up (SIGKILL, a crash, the OOM killer) takes its
ranks with it (:func:`watch_launcher`), and a rank writes its outputs only while its launcher lives
(:func:`stop_if_orphaned`). The launch directory (the ranks' logs, in the temporary folder) records its launcher's
process; the next launch removes the directories, like the namespaces, whose launcher is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import random
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distsim.core.errors import DistsimError

NS_PREFIX = "distsim-"
LAUNCH_DIR_PREFIX = "distsim-launch-"
OWNER_FILE = "launcher"
"""In a launch directory: ``PID START`` of the launcher that made it (START: its start time, /proc/PID/stat's)."""
LAUNCHER_FD_ENV = "DISTSIM_LAUNCHER_FD"
"""A rank's end of a pipe whose other end only the launcher holds: end of file means the launcher is gone."""
LAUNCHER_PID_ENV = "DISTSIM_LAUNCHER_PID"


class WorkerConfig:
    """What a launcher hands its rank processes (a dataclass), as JSON in an environment variable."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))  # type: ignore[call-overload]

    @classmethod
    def from_json(cls, text: str) -> Any:
        return cls(**json.loads(text))


def worker_main(config: type[WorkerConfig], env_var: str, run: Callable[[Any], None], command: str) -> None:
    """Entry point of a launcher-spawned rank: read its configuration from `env_var` and run it; a DistsimError is
    one line on stderr and exit status 2."""
    text = os.environ.get(env_var)
    if not text:
        print(f"distsim: error: this is a rank process of `{command}` and has no configuration ({env_var}); run "
              f"`{command}`", file=sys.stderr)  # fmt: skip
        sys.exit(2)
    launched = watch_launcher()
    try:
        run(config.from_json(text))
    except DistsimError as exc:
        print(f"distsim: error: {exc}", file=sys.stderr)
        if launched:
            _exit(2)
        sys.exit(2)
    if launched:
        _exit(0)


def _exit(code: int) -> None:
    """End a rank that launch() started once its work is done and flushed, without the interpreter's teardown: the
    C++ destructors of torch's communication threads can abort the process at exit ('terminate called without an
    active exception', SIGABRT) when the machine is loaded, failing a run that had finished. Measured on this
    project's 2-core machine, two CPU-bound processes beside a two-rank `distsim profile` extending a profile, 20 runs
    each: rank 1 aborted so in 1 and 0 runs before the launcher watch, 6 and 4 with it, none with this exit. Every
    output is written and closed by then (atomic writes), so nothing is lost."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def inject_fault(rank: int, at: str, log: Callable[[str], None]) -> None:
    """Test hook: DISTSIM_FAULT=rank=R,at=POINT,mode=die|hang makes rank R die (exit 17) or hang at POINT."""
    spec = os.environ.get("DISTSIM_FAULT")
    if not spec:
        return
    kv = dict(item.split("=", 1) for item in spec.split(","))
    if int(kv.get("rank", -1)) == rank and kv.get("at") == at:
        if kv.get("mode") == "hang":
            log(f"rank {rank}: injected hang at {at}")
            time.sleep(10**6)
        log(f"rank {rank}: injected failure at {at}")
        os._exit(17)


_RATE = re.compile(r"^\d+(\.\d+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps)$", re.IGNORECASE)


class RunError(DistsimError):
    """A launched job failed while running (a rank died, hung, or the environment refused)."""

    exit_code = 1


@dataclass(frozen=True)
class Emulation:
    nodes: int = 1
    procs_per_node: int = 1
    link_bandwidth: str | None = None
    """tc rate of the link between the two emulated nodes, e.g. ``1gbit``; None: all ranks on loopback."""

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.procs_per_node < 1:
            raise DistsimError("--emulate-nodes and --procs-per-node must be >= 1")
        if self.link_bandwidth is not None:
            if not _RATE.match(self.link_bandwidth):
                raise DistsimError(
                    f"--link-bandwidth takes a tc rate such as 1gbit or 100mbit, not {self.link_bandwidth!r}"
                )
            if self.nodes != 2:
                raise DistsimError(f"--link-bandwidth joins exactly two emulated nodes, not {self.nodes}")

    @property
    def world(self) -> int:
        return self.nodes * self.procs_per_node

    def to_dict(self) -> dict[str, object]:
        return {"nodes": self.nodes, "procs_per_node": self.procs_per_node, "link_bandwidth": self.link_bandwidth,
                "network_namespaces": self.link_bandwidth is not None}  # fmt: skip


def netns_problem() -> str | None:
    """Why network namespaces cannot be used here, or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the {tool!r} command (iproute2) is not installed"
    return None


def _run(*cmd: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RunError(f"`{' '.join(cmd)}` failed: {done.stderr.strip() or done.stdout.strip()}")


def _start_time(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat); None if it is gone or a zombie, or
    there is no /proc (then "" if it exists)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        if not Path("/proc/self/stat").exists():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return None
            except PermissionError:
                pass
            return ""
        return None
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _alive(pid: int, start: str | None = None) -> bool:
    """Whether process `pid` runs (a zombie does not); with `start`, whether it is still the process that started
    then (not a later one given the same pid)."""
    now = _start_time(pid)
    return now is not None and (start is None or not now or now == start)


def remove_stale_namespaces() -> None:
    """Delete distsim namespaces whose launcher is gone (it was killed before it could clean up)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.match(rf"^{NS_PREFIX}(\d+)-\d+$", name)
        if m and not _alive(int(m.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _make_launch_dir() -> Path:
    """A new launch directory in the temporary folder that names this process as its owner."""
    path = Path(tempfile.mkdtemp(prefix=f"{LAUNCH_DIR_PREFIX}{os.getpid()}-"))
    (path / f".{OWNER_FILE}").write_text(f"{os.getpid()} {_start_time(os.getpid()) or ''}\n")
    os.replace(path / f".{OWNER_FILE}", path / OWNER_FILE)  # whole or absent: never read half-written
    return path


def remove_stale_launch_dirs(parent: str | Path | None = None) -> list[Path]:
    """Delete the launch directories (ours, in the temporary folder) whose launcher is gone; return them.

    A directory is removed only when its owner file names a process that no longer runs: one of a running launcher
    (even one that has just made it and not yet written the file) is left alone, as is anything else."""
    removed = []
    for entry in Path(parent or tempfile.gettempdir()).glob(f"{LAUNCH_DIR_PREFIX}*"):
        try:
            info = entry.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                continue
            pid_text, _, start = (entry / OWNER_FILE).read_text().strip().partition(" ")
            pid = int(pid_text)
        except (OSError, ValueError):
            continue
        if not _alive(pid, start or None):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def watch_launcher() -> bool:
    """In a rank a launcher started: die (SIGKILL, the rank's whole process group) as soon as the launcher dies.
    Returns whether launch() started this rank (False under torchrun or in a single process).

    Two watches, as either alone has a gap. The kernel's parent-death signal is immediate and needs nothing from
    the rank (it fires even while the rank holds the GIL in a long C call), but it watches the rank's parent thread,
    which is the launcher only when nothing stands between them (``ip netns exec`` runs the rank in its own process,
    as it does not fork; a launcher thread that ends would fire it too early). The launcher's pipe watches the
    launcher process itself, through any chain of processes, on any POSIX system: its write end lives only in the
    launcher (never inherited), so the kernel closes it when the launcher exits however it exits, and a thread here
    wakes up at end of file. Both are armed before the rank does any work; a launcher that died before that is
    caught by the same end of file (or, without the pipe, by the rank's parent no longer being the launcher)."""
    global _LAUNCHER_FD
    fd_text, pid_text = os.environ.pop(LAUNCHER_FD_ENV, None), os.environ.pop(LAUNCHER_PID_ENV, None)
    if not fd_text or not pid_text:
        return False  # not started by launch(): torchrun, or a single process
    _set_parent_death_signal(signal.SIGKILL)  # the parent: the launcher, or a process of its between us
    try:
        usable = stat.S_ISFIFO(os.fstat(int(fd_text)).st_mode)
    except (OSError, ValueError):
        usable = False  # something between the launcher and the rank closed it
    if not usable:
        if os.getppid() != int(pid_text) and not _alive(int(pid_text)):
            _die()
        return True
    _LAUNCHER_FD = int(fd_text)
    if _orphaned():
        _die()
    threading.Thread(target=_die_at_end_of_file, args=(_LAUNCHER_FD,), name="distsim-launcher-watch",
                     daemon=True).start()  # fmt: skip
    return True


_LAUNCHER_FD: int | None = None


def stop_if_orphaned() -> None:
    """Called by a rank right before it writes the run's outputs: if its launcher is gone, the run was abandoned,
    and the rank dies here rather than leave outputs of a run that its user saw fail."""
    if _LAUNCHER_FD is not None and _orphaned():
        _die()


def _orphaned() -> bool:
    """The launcher's pipe is at end of file (the launcher never writes to it, so readable means closed)."""
    assert _LAUNCHER_FD is not None
    try:
        return bool(select.select([_LAUNCHER_FD], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def _die_at_end_of_file(fd: int) -> None:
    while True:
        try:
            if not os.read(fd, 1):
                break
        except OSError:
            break
    _die()


def _die() -> None:
    """End this rank and whatever it started (its process group, when it leads one, as launch() makes it)."""
    with contextlib.suppress(OSError):
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _set_parent_death_signal(signum: int) -> bool:
    """prctl(PR_SET_PDEATHSIG, signum) on Linux; False where it is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(1, signum, 0, 0, 0)) == 0  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return False


@dataclass
class NetnsNodes:
    """Two network namespaces joined by a shaped veth pair (use as a context manager)."""

    bandwidth: str
    names: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    ifnames: list[str] = field(default_factory=list)

    def __enter__(self) -> NetnsNodes:
        problem = netns_problem()
        if problem:
            raise DistsimError(f"--link-bandwidth needs network namespaces, but {problem}; "
                               "drop --link-bandwidth to emulate the nodes on loopback")  # fmt: skip
        remove_stale_namespaces()
        pid, subnet = os.getpid(), random.randint(16, 250)
        self.names = [f"{NS_PREFIX}{pid}-{k}" for k in range(2)]
        self.ifnames = [f"dsv{pid % 100000}a", f"dsv{pid % 100000}b"]
        self.addresses = [f"10.{subnet}.{pid % 250}.1", f"10.{subnet}.{pid % 250}.2"]
        try:
            for name in self.names:
                _run("ip", "netns", "add", name)
            _run("ip", "link", "add", self.ifnames[0], "type", "veth", "peer", "name", self.ifnames[1])
            burst = _burst_bytes(self.bandwidth)
            for name, ifname, addr in zip(self.names, self.ifnames, self.addresses, strict=True):
                _run("ip", "link", "set", ifname, "netns", name)
                _run("ip", "-n", name, "addr", "add", f"{addr}/24", "dev", ifname)
                _run("ip", "-n", name, "link", "set", "lo", "up")
                _run("ip", "-n", name, "link", "set", ifname, "up")
                _run("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", ifname, "root", "tbf",
                     "rate", self.bandwidth, "burst", str(burst), "latency", "100ms")  # fmt: skip
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)

    def prefix(self, node: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[node]]


def _burst_bytes(rate: str) -> int:
    """A tbf bucket that holds at least one timer tick (4 ms) of traffic at `rate`, and at least 64 KiB."""
    m = re.match(r"^(\d+(?:\.\d+)?)([a-z]+)$", rate.lower())
    assert m is not None
    value, unit = float(m.group(1)), m.group(2)
    scale = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
             "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}[unit]  # fmt: skip
    return max(64 * 1024, int(value * scale / 8 * 0.004))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _last_message(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return (errors or lines or [""])[-1][:300]


@contextlib.contextmanager
def raising_on_signals(*signums: int) -> Iterator[None]:
    """While the block runs, each of `signums` raises SystemExit(128 + signum) (SIGINT already raises
    KeyboardInterrupt), so that cleanup runs: children and namespaces stopped, temporary files removed. Only the main
    thread can set handlers; in another thread the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def launch(module: str, env: dict[str, str], emulation: Emulation, timeout_s: float, what: str = "job") -> None:
    """Run `python -m module` as emulation.world ranks; raise RunError if any rank fails or time runs out."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if emulation.world > cores:
        print(f"warning: {emulation.world} ranks on {cores} cores: ranks share cores, so compute timings will be "
              "distorted", file=sys.stderr)  # fmt: skip
    with contextlib.ExitStack() as stack, raising_on_signals(signal.SIGTERM):
        remove_stale_launch_dirs()
        if emulation.link_bandwidth is None and netns_problem() is None:
            remove_stale_namespaces()  # (NetnsNodes removes them itself)
        netns = stack.enter_context(NetnsNodes(emulation.link_bandwidth)) if emulation.link_bandwidth else None
        logdir = _make_launch_dir()
        stack.callback(shutil.rmtree, logdir, ignore_errors=True)
        master = netns.addresses[0] if netns else "127.0.0.1"
        port = _free_port() if netns is None else random.randint(20000, 60000)
        watch_r, watch_w = os.pipe()  # neither end inherited unless passed: only the ranks get the read end
        stack.callback(os.close, watch_w)  # after the ranks are stopped (callbacks run last first)
        procs: list[subprocess.Popen[bytes]] = []
        stack.callback(_stop, procs)
        stack.callback(os.close, watch_r)
        for rank in range(emulation.world):
            node, local = divmod(rank, emulation.procs_per_node)
            rank_env = {
                **os.environ, **env,
                "RANK": str(rank), "WORLD_SIZE": str(emulation.world), "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": str(emulation.procs_per_node), "GROUP_RANK": str(node),
                "MASTER_ADDR": master, "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": str(max(1, cores // emulation.world)),
                "GLOO_SOCKET_IFNAME": netns.ifnames[node] if netns else "lo",
                "DISTSIM_PIN_CPU": str(rank % cores),
                "PYTHONUNBUFFERED": "1",
                "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"),  # e.g. hostname lookups in netns
                LAUNCHER_FD_ENV: str(watch_r), LAUNCHER_PID_ENV: str(os.getpid()),
            }  # fmt: skip
            cmd = [*(netns.prefix(node) if netns else []), sys.executable, "-m", module]
            log = open(logdir / f"rank{rank}.log", "wb")  # noqa: SIM115 - closed when the process ends
            stack.callback(log.close)
            # rank 0 reports progress on our stderr; the others write to a log we quote if they fail
            procs.append(subprocess.Popen(cmd, env=rank_env, stdout=subprocess.DEVNULL, pass_fds=(watch_r,),
                                          stderr=None if rank == 0 else log, start_new_session=True))  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank, code = failed[0]
                message = _last_message(logdir / f"rank{rank}.log") if rank else "see its messages above"
                raise RunError(f"{what} failed: rank {rank} exited with status {code}"
                               + (f": {message}" if message else ""))  # fmt: skip
            if all(c == 0 for c in codes):
                return
            if time.monotonic() > deadline:
                running = [r for r, c in enumerate(codes) if c is None]
                raise RunError(f"{what} did not finish within {timeout_s:g} s (--timeout); rank(s) "
                               f"{', '.join(map(str, running))} still running, stopped them")  # fmt: skip
            time.sleep(0.1)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate every rank still running (its whole process group), then kill what does not stop."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
