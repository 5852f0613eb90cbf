"""Emulated nodes: the shaped link between two network namespaces, checked by what the kernel holds and by a
transfer's lower bound (load can only make a transfer slower, never faster than its token bucket allows)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from distsim.infra.launch import Emulation, NetnsNodes, _burst_bytes, netns_problem

pytestmark = [
    pytest.mark.skipif(netns_problem() is not None, reason=f"network namespaces: {netns_problem()}"),
    pytest.mark.slow,
]

RECEIVER = """
import socket, sys
size = int(sys.argv[1])
srv = socket.create_server((sys.argv[2], 0))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
got = 0
while got < size:
    chunk = conn.recv(1 << 16)
    if not chunk:
        break
    got += len(chunk)
conn.sendall(b"k")
print(got, flush=True)
"""

SENDER = """
import socket, sys, time
size, port = int(sys.argv[1]), int(sys.argv[2])
conn = socket.create_connection((sys.argv[3], port), timeout=120)
t0 = time.perf_counter()
conn.sendall(b"x" * size)
assert conn.recv(1) == b"k"
print(time.perf_counter() - t0, flush=True)
"""


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_the_link_is_shaped_at_the_requested_rate_and_removed_after() -> None:
    rate, rate_bytes_per_s = "20mbit", 20e6 / 8
    size = 1 << 20
    with NetnsNodes(rate) as nodes:
        names = list(nodes.names)
        assert all(n in _namespaces() for n in names)
        for name, ifname in zip(nodes.names, nodes.ifnames, strict=True):
            shown = subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "show", "dev", ifname],
                                   capture_output=True, text=True, check=True).stdout  # fmt: skip
            assert "tbf" in shown and "rate 20Mbit" in shown, shown
        receiver = subprocess.Popen([*nodes.prefix(1), sys.executable, "-c", RECEIVER, str(size), nodes.addresses[1]],
                                    stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            assert receiver.stdout is not None
            port = int(receiver.stdout.readline())
            sent = subprocess.run([*nodes.prefix(0), sys.executable, "-c", SENDER, str(size), str(port),
                                   nodes.addresses[1]], capture_output=True, text=True, timeout=300)  # fmt: skip
            assert sent.returncode == 0, sent.stderr
            assert int(receiver.stdout.readline()) == size
        finally:
            receiver.kill()
            receiver.wait()
    # a token bucket passes at most burst + rate x t bytes in t seconds
    assert float(sent.stdout) >= (size - _burst_bytes(rate)) / rate_bytes_per_s
    listed = _namespaces()
    assert not any(n in listed for n in names)


def test_a_failed_setup_leaves_no_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    import distsim.infra.launch as launch

    real_run = launch._run

    def failing(*cmd: str) -> None:
        if cmd[:2] == ("ip", "link") and "veth" in cmd:
            raise launch.RunError("injected failure")
        real_run(*cmd)

    monkeypatch.setattr(launch, "_run", failing)
    nodes = NetnsNodes("20mbit")
    with pytest.raises(launch.RunError, match="injected failure"), nodes:
        pass
    listed = _namespaces()
    assert nodes.names and not any(n in listed for n in nodes.names)


def test_emulation_refuses_a_bad_rate() -> None:
    from distsim.core.errors import DistsimError

    with pytest.raises(DistsimError, match="takes a tc rate"):
        Emulation(2, 1, "fast")
