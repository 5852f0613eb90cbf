"""Per-rank trace formats: one file per GPU, as the tools that read a distributed job's traces expect them.

Each format names its writer by import path, imported only when that format is written (a writer may need a package,
or a module another part of distsim provides, that a run without it should not import). A writer takes either the
timeline (formats of what ran: Kineto, for Holistic Trace Analysis and Perfetto) or the whole simulation result
(formats of the event flow: Chakra execution traces, which a measured run has no flow for).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from distsim.io.output import OutputError

RANK_FORMATS: dict[str, tuple[str, str]] = {
    "kineto": (
        "PyTorch-profiler (Kineto) JSON per rank, for Holistic Trace Analysis and Perfetto",
        "distsim.io.kineto:write_kineto_traces",
    ),
    "chakra": (
        "Chakra execution trace per rank (the simulated event flow; simulate only)",
        "distsim.io.chakra:write_chakra_traces",
    ),
}
"""Format name -> (description, writer as ``module:function``)."""
NEEDS_RESULT = frozenset({"chakra"})
"""Formats written from a simulation result (its event flow), not from a timeline."""


def writer(fmt: str) -> Any:
    """The writer function of a format, imported now."""
    if fmt not in RANK_FORMATS:
        raise OutputError(f"unknown per-rank trace format {fmt!r}; use one of {', '.join(RANK_FORMATS)}")
    module, _, name = RANK_FORMATS[fmt][1].partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module.startswith(exc.name):  # a package the writer needs, not the writer
            raise OutputError(f"--trace-format {fmt} needs the package {exc.name}: pip install {exc.name}") from None
        raise OutputError(f"--trace-format {fmt} is not available in this distsim ({module} is missing)") from None


def make_directory(directory: str | Path, option: str = "--trace-dir") -> Path:
    """Create `directory` (and its parents) if needed and check that files can be written in it; one line if not."""
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"{option} {path}: exists and is not a directory") from None
    except OSError as exc:
        raise OutputError(f"{option} {path}: cannot create ({exc.strerror or exc.__class__.__name__})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise OutputError(f"{option} {path}: directory is not writable")
    return path


def write_rank_traces(fmt: str, directory: str | Path, *, timeline: Any = None, result: Any = None,
                      stem: str = "distsim", **options: Any) -> list[Path]:  # fmt: skip
    """Write the per-rank traces of format `fmt` into `directory` (created if missing); return their paths.

    Kineto takes the `timeline` (or a `result`'s); chakra takes the simulation `result` (its event flow).
    `options` go to the writer (Kineto: ``backend``, ``device_name``, ``step``)."""
    write = writer(fmt)
    path = make_directory(directory)
    if fmt in NEEDS_RESULT:
        if result is None:
            raise OutputError(f"--trace-format {fmt} writes a simulation's event flow: a measured run has none")
        return list(write(result, path, stem, **options))
    if timeline is None:
        if result is None:
            raise ValueError("write_rank_traces needs a timeline or a result")
        timeline = result.timeline
        gpu = result.cluster.gpu
        options.setdefault("device_name", gpu.name)
        options.setdefault("backend", "nccl" if getattr(gpu, "sm_count", 1) > 0 else "gloo")  # a CPU "cluster": gloo
    return list(write(timeline, path, stem, **options))
