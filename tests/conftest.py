"""Shared fixtures: the models, clusters and costs many tests start from, and a real full filesystem for the
write-failure tests. Tests live in tests/unit (pure logic, the CLI in process, fast) and tests/integration (real
processes, torch, kernels and notebooks: mostly marked slow)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from distsim.core.cluster import Cluster, get_cluster
from distsim.core.models import Model, get_model
from tests.util import chain_model


@pytest.fixture(scope="session")
def hand_chain() -> Model:
    """Three layers, forward 1 s and backward 2 s each, with 0.5 M, 1 M and 0.25 M parameters and no activations
    to send: gradient-sync and sharding timelines one can draw by hand."""
    return chain_model([(1.0, 2.0, 500_000, 0.0), (1.0, 2.0, 1_000_000, 0.0), (1.0, 2.0, 250_000, 0.0)])


@pytest.fixture(scope="session")
def gpt2() -> Model:
    """The zoo's GPT-2 345M (24 layers, seq 1024)."""
    return get_model("gpt2-345m")


@pytest.fixture(scope="session")
def testbed() -> Cluster:
    """The distsim-testbed preset (DistSim's own 2-node evaluation cluster)."""
    return get_cluster("distsim-testbed")


@pytest.fixture
def full_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on a real filesystem with no space left (a 64 KiB tmpfs filled to the last block): creating a
    file may still work, writing data to it fails with ENOSPC. Needs root (mount); skipped elsewhere."""
    mount = tmp_path / "full"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,nr_inodes=64", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        with open(mount / ".fill", "wb", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"\0" * 4096)
            except OSError:
                pass
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
