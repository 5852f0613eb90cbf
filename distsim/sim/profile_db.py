"""The profile database: measured event durations plus alpha-beta fits, with provenance.

Schema (JSON, ``schema: distsim-profile``, ``version: 1``)::

    {
      "schema": "distsim-profile", "version": 1,
      "provenance": {"device": "...", "backend": "nccl|gloo", "torch": "...", "nccl": "...", "date": "...",
                     "load": {...}, "runs": [{"date": ..., "command": ..., "compute_events": n,
                                              "comm_measurements": n, "load": {...}}], ...},
      "compute": {"<compute event key>": {"mean_s": 1.3e-3, "median_s": 1.2e-3, "p10_s": ..., "p90_s": ...,
                                          "repeats": 20, "flops": 1.0e9, "launch_s": 2.1e-4,
                                          "insitu_ratio": 1.03}},
      "comm": [{"collective": "all_reduce", "scope": "intra", "group_size": 2, "bytes": 1048576,
                "median_s": 2.1e-4, "p10_s": ..., "p90_s": ..., "repeats": 20, "note": "..."}, ...],
      "fits": [{"collective": "all_reduce", "scope": "intra", "group_size": 2,
                "alpha_s": 1.5e-5, "beta_s_per_byte": 1.9e-10, "points": 8}, ...],
      "compute_fits": [{"family": "optimizer/state_bytes=16", "alpha_s": ..., "beta_s_per_unit": ..., "points": 4}],
      "interference": [{"scope": "intra", "group_size": 2, "bytes": 16777216, "compute_slowdown": 0.4,
                        "comm_slowdown": 0.6}],
      "collocation": {"slowdown": 0.05, "compute_s": 2.1e-3, "alone_s": 4.3e-3, "collocated_s": 4.4e-3,
                      "cycles": 200, "background_busy": 0.45, "method": "..."},
      "host": {"forward_op_s": 1.1e-5, "backward_op_s": 1.5e-5, "method": "eager nn.Module chain, ...",
               "per_kernel_s": {"F": 6.3e-5, "B": 8.4e-5}, "per_kernel_events": {"F": 24, "B": 24}}
    }

Version 2 adds ``"model"``: the layer graph of a profiled torch module (``distsim profile --torch-model``) in the
model-file format of :mod:`distsim.core.models.loader`, whose compute events are in ``compute``; ``distsim simulate
--model FILE`` reads it. A profile without a model is still written as version 1, and both versions are read.

``collocation`` (optional, added to version 1 like ``launch_s``) is how much a low-priority background job on the
same device slows the foreground's compute (``distsim profile --collocation``, see ``distsim.profiler.collocation``).

``host`` (optional, added to version 1 the same way) is the profiling host's speed (:class:`HostSpeed`): its seconds
per eager PyTorch operator, forward and backward (``distsim.profiler.host``), and on accelerators its seconds per
kernel derived from the measured blocks' launch times (``per_kernel_s``, which ``ProfileCosts`` charges the events
the profile did not measure).

``load`` holds each rank's reference-workload time before and after profiling and the machine's load average
(see ``distsim.infra.machine_load``); the top-level one is the latest run's, as is ``self_check`` (the in-situ chains
that
state the profile's own bias, see ``distsim.infra.self_check``). A compute event's optional ``launch_s`` is the host's
mean time to enqueue it on an accelerator (absent on CPU), ``insitu_ratio`` its isolated / in-situ time. Both were
added to version 1 without changing it: profiles without them load, and readers that do not know them ignore them.
Compute keys are ``ComputeEvent.key`` strings (see ``distsim.sim.costs``), so the profiler and the simulator agree by
construction. Collectives are ``all_reduce``, ``all_gather``, ``reduce_scatter`` and ``p2p``; scope is ``intra``
or ``inter``. Fits are derived from the measurements (least squares, alpha and beta kept >= 0) and recomputed
whenever profiles are merged. This module is pure: reading and writing files lives in ``distsim.io.files``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np

from distsim.core.checks import number
from distsim.core.errors import ProfileError

T = TypeVar("T")

SCHEMA = "distsim-profile"
VERSION = 1
"""Version of a profile without a model (readable by every distsim that reads profiles)."""
MODEL_VERSION = 2
"""Version of a profile with a ``model`` section."""
READABLE_VERSIONS = (VERSION, MODEL_VERSION)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "p2p")
SCOPES = ("intra", "inter")
_OPTIMIZER_KEY = re.compile(r"^optimizer/params=(\d+)/state_bytes=(\d+)$")


@dataclass(frozen=True)
class Measurement:
    median_s: float
    p10_s: float | None = None
    p90_s: float | None = None
    repeats: int = 1
    flops: float | None = None
    """FLOPs of the event as counted by torch (for achieved FLOP/s), if known."""
    mean_s: float | None = None
    """Mean over the repetitions; the cost the simulator uses when present (an iteration sums many events, so its
    expectation is the sum of their means, which for right-skewed timings exceed their medians)."""
    samples_s: tuple[float, ...] | None = None
    """The repetitions themselves, which the stochastic simulation (``--samples``) draws durations from."""
    launch_s: float | None = None
    """Mean host seconds to enqueue the event's kernels on an accelerator (the host stream's share of the event);
    None where the host runs the work itself (CPU) or the profile predates it."""
    insitu_ratio: float | None = None
    """The profile's self-check: this event's isolated time over its time inside a short chain of its stage's
    blocks run without host synchronisation (> 1: isolated timing is slower than in situ); None if not checked."""

    @property
    def seconds(self) -> float:
        return self.mean_s if self.mean_s is not None else self.median_s


@dataclass(frozen=True)
class CommMeasurement:
    collective: str
    scope: str
    group_size: int
    bytes: int
    median_s: float
    p10_s: float | None = None
    p90_s: float | None = None
    repeats: int = 1
    note: str | None = None
    """How the backend implemented it, where that differs from the collective's name."""
    mean_s: float | None = None
    """Mean over the repetitions (used as the cost when present, see Measurement.mean_s)."""
    samples_s: tuple[float, ...] | None = None
    """The repetitions themselves (see Measurement.samples_s)."""

    @property
    def group(self) -> tuple[str, str, int]:
        return (self.collective, self.scope, self.group_size)

    @property
    def seconds(self) -> float:
        return self.mean_s if self.mean_s is not None else self.median_s


@dataclass(frozen=True)
class AlphaBetaFit:
    """T(bytes) = alpha_s + beta_s_per_byte * bytes for one (collective, scope, group size)."""

    collective: str
    scope: str
    group_size: int
    alpha_s: float
    beta_s_per_byte: float
    points: int = 0

    def time_s(self, nbytes: float) -> float:
        return self.alpha_s + self.beta_s_per_byte * nbytes

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return 1 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else float("inf")


@dataclass(frozen=True)
class ComputeFit:
    """T(units) = alpha_s + beta_s_per_unit * units for a family of compute events (optimizer step: parameters)."""

    family: str
    alpha_s: float
    beta_s_per_unit: float
    points: int = 0

    def time_s(self, units: float) -> float:
        return self.alpha_s + self.beta_s_per_unit * units


def fit_linear(xs: list[float], ts: list[float]) -> tuple[float, float]:
    """(alpha, beta) of the least-squares line t = alpha + beta x, both kept >= 0.

    Absolute (not relative) error: measured sizes are interpolated, so the fit's job is to extrapolate, mostly to
    messages larger than those measured, where the slope (bandwidth) matters.
    """
    x, t = np.asarray(xs, dtype=float), np.asarray(ts, dtype=float)
    a = np.stack([np.ones_like(x), x], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(a, t, rcond=None)
    if alpha < 0:  # through the origin
        alpha, beta = 0.0, float(np.sum(x * t) / max(np.sum(x * x), 1e-300))
    if beta < 0:  # a flat curve: the mean
        alpha, beta = float(np.mean(t)), 0.0
    return float(alpha), float(beta)


def fit_comm(measurements: tuple[CommMeasurement, ...]) -> tuple[AlphaBetaFit, ...]:
    """One fit per (collective, scope, group size) that has at least two distinct sizes."""
    groups: dict[tuple[str, str, int], list[CommMeasurement]] = {}
    for m in measurements:
        groups.setdefault(m.group, []).append(m)
    fits = []
    for (c, scope, n), ms in sorted(groups.items()):
        if len({m.bytes for m in ms}) < 2:
            continue
        alpha, beta = fit_linear([m.bytes for m in ms], [m.seconds for m in ms])
        fits.append(AlphaBetaFit(c, scope, n, alpha, beta, len(ms)))
    return tuple(fits)


def fit_optimizer(compute: dict[str, Measurement]) -> tuple[ComputeFit, ...]:
    """Optimizer-step time against parameters, per bytes-of-state, from the measured optimizer events."""
    groups: dict[int, list[tuple[int, float]]] = {}
    for key, m in compute.items():
        match = _OPTIMIZER_KEY.match(key)
        if match:
            groups.setdefault(int(match.group(2)), []).append((int(match.group(1)), m.seconds))
    fits = []
    for state, pts in sorted(groups.items()):
        if len({p for p, _ in pts}) < 2:
            continue
        alpha, beta = fit_linear([p for p, _ in pts], [t for _, t in pts])
        fits.append(ComputeFit(f"optimizer/state_bytes={state}", alpha, beta, len(pts)))
    return tuple(fits)


@dataclass(frozen=True)
class Interference:
    """How overlapped communication and compute slow each other on one link class (measured, per scope).

    While an all-reduce of ``bytes`` runs in the background, a compute kernel on the same rank takes
    ``1 + compute_slowdown`` times as long, and the all-reduce ``1 + comm_slowdown`` times as long as alone. On CPUs
    both share the rank's cores (the TCP stack, gloo's copies and reductions); on GPUs NCCL kernels take SMs.
    """

    scope: str
    group_size: int
    bytes: int
    compute_slowdown: float
    comm_slowdown: float


@dataclass(frozen=True)
class Collocation:
    """How a low-priority background job on the same device slows the foreground (DeepPool's GPU multiplexing),
    measured as a foreground that alternates a compute kernel (``compute_s`` alone) with an idle gap as long, over
    ``cycles`` cycles alone and as many with the background running: ``slowdown`` = (``collocated_s`` - ``alone_s``)
    / ``compute_s``, the median cycle's extra time per second of foreground compute (kept >= 0: collocation cannot
    speed the foreground up, a negative difference is noise). ``background_busy``: the share of the collocated
    cycles' time the background ran (None if not known), which shows it did fill the gaps; ``method``: how it was
    measured (device, priorities, kernel sizes)."""

    slowdown: float
    compute_s: float
    alone_s: float
    collocated_s: float
    cycles: int
    method: str
    background_busy: float | None = None


@dataclass(frozen=True)
class HostSpeed:
    """The profiling host's speed. ``forward_op_s`` / ``backward_op_s``: host seconds per eager PyTorch operator, an
    ``nn.Module`` call recording autograd and the autograd engine's node for it (a chain of tiny modules, see
    ``distsim.profiler.host``; on CUDA the launch included), measured as ``method`` says; None if not measured.
    ``per_kernel_s``: on accelerators, host seconds per kernel of the measured blocks (``F``, ``B``: the median over
    the measured compute events of their launch time over their kernel count from the analytic op lists, the GPU's
    launch included), over ``per_kernel_events`` events per phase; empty where none was measured (CPU).
    ``backward_call_s``: host seconds of one ``backward()`` call beyond its operators' (the engine's start and end),
    which a block's backward launch timed alone includes and a training loop pays once per micro-batch; None if not
    measured (older profiles)."""

    forward_op_s: float | None = None
    backward_op_s: float | None = None
    method: str = ""
    per_kernel_s: dict[str, float] = field(default_factory=dict)
    per_kernel_events: dict[str, int] = field(default_factory=dict)
    backward_call_s: float | None = None

    def merge(self, newer: HostSpeed | None) -> HostSpeed:
        """This reading updated by `newer`'s: its per-operator figures where it measured them, its per-kernel figure
        per phase where it has one."""
        if newer is None:
            return self
        ops = newer if newer.forward_op_s is not None else self
        kernel = {**self.per_kernel_s, **newer.per_kernel_s}
        events = {p: (newer if p in newer.per_kernel_s else self).per_kernel_events.get(p, 0) for p in kernel}
        return HostSpeed(ops.forward_op_s, ops.backward_op_s, ops.method, kernel, events, ops.backward_call_s)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"forward_op_s": self.forward_op_s, "backward_op_s": self.backward_op_s,
                               "backward_call_s": self.backward_call_s, "method": self.method or None}  # fmt: skip
        out = {k: v for k, v in out.items() if v is not None}
        if self.per_kernel_s:
            out["per_kernel_s"] = dict(sorted(self.per_kernel_s.items()))
            out["per_kernel_events"] = dict(sorted(self.per_kernel_events.items()))
        return out


@dataclass(frozen=True)
class ProfileDB:
    provenance: dict[str, Any] = field(default_factory=dict)
    compute: dict[str, Measurement] = field(default_factory=dict)
    comm: tuple[CommMeasurement, ...] = ()
    fits: tuple[AlphaBetaFit, ...] = ()
    compute_fits: tuple[ComputeFit, ...] = ()
    interference: tuple[Interference, ...] = ()
    model: dict[str, Any] | None = None
    """The profiled torch module's layer graph (model-file format), or None; checked when it is loaded as a model."""
    collocation: Collocation | None = None
    """The measured slowdown of a collocated background job, or None."""
    host: HostSpeed | None = None
    """The profiling host's speed (per eager operator; per kernel on accelerators), or None (older profiles)."""

    # ---------------------------------------------------------------------------------------------- lookups
    def interference_for(self, scope: str) -> Interference | None:
        return next((i for i in self.interference if i.scope == scope), None)

    def comm_exact(self, collective: str, scope: str, group_size: int, nbytes: int) -> CommMeasurement | None:
        for m in self.comm:
            if (m.collective, m.scope, m.group_size, m.bytes) == (collective, scope, group_size, nbytes):
                return m
        return None

    def fit(self, collective: str, scope: str, group_size: int) -> AlphaBetaFit | None:
        for f in self.fits:
            if (f.collective, f.scope, f.group_size) == (collective, scope, group_size):
                return f
        return None

    def interpolate(self, collective: str, scope: str, group_size: int, nbytes: int) -> float | None:
        """Time at `nbytes` by linear interpolation between the nearest measured sizes around it, or None."""
        points = sorted((m.bytes, m.seconds) for m in self.comm if m.group == (collective, scope, group_size))
        for (b0, t0), (b1, t1) in itertools.pairwise(points):
            if b0 <= nbytes <= b1 and b1 > b0:
                return t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0)
        return None

    def nearest(self, collective: str, scope: str, group_size: int, nbytes: int) -> CommMeasurement | None:
        """The measurement of this group whose size is closest to `nbytes` (in ratio)."""
        ms = [m for m in self.comm if m.group == (collective, scope, group_size) and m.bytes > 0]
        return min(ms, key=lambda m: abs(np.log(m.bytes / max(nbytes, 1)))) if ms else None

    def compute_fit(self, family: str) -> ComputeFit | None:
        return next((f for f in self.compute_fits if f.family == family), None)

    # ------------------------------------------------------------------------------------------ derive, merge
    def refit(self) -> ProfileDB:
        """The same measurements with their fits recomputed."""
        return replace(self, fits=fit_comm(self.comm), compute_fits=fit_optimizer(self.compute))

    def incompatibility(self, provenance: dict[str, Any]) -> str | None:
        """Why measurements taken under `provenance` cannot extend this profile, or None.

        Compute times depend on the device and, on CPUs, the threads per rank; communication on the backend (a
        compute-only run, backend ``none``, extends any profile of the same device).
        """
        mine = self.provenance
        for key, what in (("device", "device"), ("threads_per_rank", "threads per rank")):
            a, b = mine.get(key), provenance.get(key)
            if a is not None and b is not None and a != b:
                return f"the profile was measured with {what} {a!r}, this run would use {b!r}"
        a, b = mine.get("backend"), provenance.get("backend")
        if a not in (None, "none") and b not in (None, "none") and a != b:
            return f"the profile's communication was measured with {a!r}, this run would use {b!r}"
        return None

    def merge(self, newer: ProfileDB) -> ProfileDB:
        """This profile extended by `newer` (whose measurements win where both have one); fits recomputed.

        Measurements of another device, thread count or communication backend are refused (see incompatibility).
        """
        problem = self.incompatibility(newer.provenance)
        if problem:
            raise ProfileError(f"cannot extend this profile: {problem}")
        comm = {(m.group, m.bytes): m for m in self.comm}
        comm.update({(m.group, m.bytes): m for m in newer.comm})
        provenance = {**self.provenance, **{k: v for k, v in newer.provenance.items() if k != "runs"}}
        if newer.provenance.get("backend") == "none" and self.provenance.get("backend"):
            provenance["backend"] = self.provenance["backend"]  # a compute-only run keeps the communication's
            for key in ("nodes", "procs_per_node", "emulation", "note"):
                if key in self.provenance:
                    provenance[key] = self.provenance[key]
                else:
                    provenance.pop(key, None)
        provenance["runs"] = [*self.provenance.get("runs", []), *newer.provenance.get("runs", [])]
        interference = {i.scope: i for i in self.interference}
        interference.update({i.scope: i for i in newer.interference})
        return ProfileDB(
            provenance=provenance,
            compute={**self.compute, **newer.compute},
            comm=tuple(comm[k] for k in sorted(comm)),
            interference=tuple(interference[k] for k in sorted(interference)),
            model=newer.model if newer.model is not None else self.model,
            collocation=newer.collocation if newer.collocation is not None else self.collocation,
            host=newer.host if self.host is None else self.host.merge(newer.host),
        ).refit()

    # -------------------------------------------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict[str, Any]:
        def clean(d: dict[str, Any]) -> dict[str, Any]:
            out = {k: v for k, v in d.items() if v is not None}
            if "samples_s" in out:  # microsecond resolution keeps the file small
                out["samples_s"] = [round(x, 7) for x in out["samples_s"]]
            return out

        out = {
            "schema": SCHEMA,
            "version": VERSION if self.model is None else MODEL_VERSION,
            "provenance": dict(self.provenance),
            "compute": {k: clean(vars(m)) for k, m in sorted(self.compute.items())},
            "comm": [clean(vars(m)) for m in self.comm],
            "fits": [vars(f).copy() for f in self.fits],
            "compute_fits": [vars(f).copy() for f in self.compute_fits],
            "interference": [vars(i).copy() for i in self.interference],
        }
        if self.model is not None:
            out["model"] = dict(self.model)
        if self.collocation is not None:
            out["collocation"] = {k: v for k, v in vars(self.collocation).items() if v is not None}
        if self.host is not None:
            out["host"] = self.host.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "profile") -> ProfileDB:
        """Read a profile mapping; a malformed entry is named (``compute 'KEY'``, ``comm[3]``) with its problem."""
        if not isinstance(data, dict):
            raise ProfileError(f"{where}: expected a JSON object at the top level")
        if data.get("schema") != SCHEMA:
            raise ProfileError(f"{where}: not a distsim profile (schema is {data.get('schema')!r}, want {SCHEMA!r})")
        if data.get("version") not in READABLE_VERSIONS:
            raise ProfileError(f"{where}: profile schema version {data.get('version')!r}; this distsim reads "
                               f"{' and '.join(map(str, READABLE_VERSIONS))}")  # fmt: skip
        raw_compute = _section(data, "compute", dict, where)
        compute = {str(k): _entry(_measurement, v, f"{where}: compute {k!r}") for k, v in raw_compute.items()}
        comm, fits, compute_fits, interference = (
            tuple(_entry(read, v, f"{where}: {key}[{i}]") for i, v in enumerate(_section(data, key, list, where)))
            for key, read in (("comm", _comm), ("fits", _fit), ("compute_fits", _compute_fit),
                              ("interference", _interference))
        )  # fmt: skip
        provenance = _section(data, "provenance", dict, where)
        model = data.get("model")
        if model is not None and not isinstance(model, dict):
            raise ProfileError(f"{where}: model must be an object (a layer graph), got {type(model).__name__}")
        raw = data.get("collocation")
        collocation = None if raw is None else _entry(_collocation, raw, f"{where}: collocation")
        raw = data.get("host")
        host = None if raw is None else _entry(_host, raw, f"{where}: host")
        return cls(dict(provenance), compute, comm, fits, compute_fits, interference, model, collocation, host)


def _section(data: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = data.get(key, kind())
    if not isinstance(value, kind):
        raise ProfileError(f"{where}: {key} must be a JSON {'object' if kind is dict else 'array'}")
    return value


def _entry(read: Callable[[Any], T], value: Any, what: str) -> T:
    """One entry read by `read`; any problem becomes one line naming the entry."""
    try:
        return read(value)
    except KeyError as exc:
        raise ProfileError(f"{what}: malformed entry (missing {exc.args[0]!r})") from None
    except ProfileError as exc:
        raise ProfileError(f"{what}: {exc}") from None
    except (TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise ProfileError(f"{what}: malformed entry ({exc.__class__.__name__}: {exc})") from None


def _positive(value: Any, name: str) -> float:
    """A finite number >= 0 (JSON's NaN and Infinity, which Python's json reads, are refused)."""
    return number(value, name, ProfileError)


def _finite(value: Any, name: str) -> float:
    return number(value, name, ProfileError, minimum=None)


def _opt(v: dict[str, Any], key: str, read: Callable[[Any, str], float]) -> float | None:
    return None if v.get(key) is None else read(v[key], key)


def _measurement(v: Any) -> Measurement:
    if not isinstance(v, dict):
        raise ProfileError(f"expected an object, got {type(v).__name__}")
    samples = v.get("samples_s")
    if samples is not None and not isinstance(samples, list):
        raise ProfileError("samples_s must be an array")
    return Measurement(
        median_s=_positive(v["median_s"], "median_s"),
        p10_s=_opt(v, "p10_s", _finite),
        p90_s=_opt(v, "p90_s", _finite),
        repeats=int(v.get("repeats", 1)),
        flops=_opt(v, "flops", _finite),
        mean_s=_opt(v, "mean_s", _positive),
        samples_s=None if samples is None else tuple(_positive(x, "samples_s") for x in samples),
        launch_s=_opt(v, "launch_s", _positive),
        insitu_ratio=_opt(v, "insitu_ratio", _positive),
    )


def _check_comm_fields(v: Any) -> tuple[str, str, int]:
    if not isinstance(v, dict):
        raise ProfileError(f"expected an object, got {type(v).__name__}")
    collective, scope, n = str(v["collective"]), str(v["scope"]), int(v["group_size"])
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}")
    if scope not in SCOPES:
        raise ValueError(f"scope must be intra or inter, got {scope!r}")
    if n < 2:
        raise ValueError(f"group_size must be >= 2, got {n}")
    return collective, scope, n


def _comm(v: Any) -> CommMeasurement:
    collective, scope, n = _check_comm_fields(v)
    m = _measurement(v)
    note = None if v.get("note") is None else str(v["note"])
    return CommMeasurement(collective, scope, n, int(v["bytes"]), m.median_s, m.p10_s, m.p90_s, m.repeats, note,
                           m.mean_s, m.samples_s)  # fmt: skip


def _fit(v: Any) -> AlphaBetaFit:
    collective, scope, n = _check_comm_fields(v)
    return AlphaBetaFit(
        collective, scope, n, _finite(v["alpha_s"], "alpha_s"), _positive(v["beta_s_per_byte"], "beta_s_per_byte"),
        int(v.get("points", 0)),
    )  # fmt: skip


def _compute_fit(v: Any) -> ComputeFit:
    return ComputeFit(str(v["family"]), _finite(v["alpha_s"], "alpha_s"),
                      _positive(v["beta_s_per_unit"], "beta_s_per_unit"), int(v.get("points", 0)))  # fmt: skip


def _interference(v: Any) -> Interference:
    return Interference(str(v["scope"]), int(v["group_size"]), int(v["bytes"]),
                        _finite(v["compute_slowdown"], "compute_slowdown"),
                        _finite(v["comm_slowdown"], "comm_slowdown"))  # fmt: skip


def _collocation(v: Any) -> Collocation:
    if not isinstance(v, dict):
        raise ProfileError(f"expected an object, got {type(v).__name__}")
    busy = _opt(v, "background_busy", _positive)
    return Collocation(_positive(v["slowdown"], "slowdown"), _positive(v["compute_s"], "compute_s"),
                       _positive(v["alone_s"], "alone_s"), _positive(v["collocated_s"], "collocated_s"),
                       int(v["cycles"]), str(v.get("method", "")), busy)  # fmt: skip


def _host_seconds(value: Any, name: str) -> float:
    """Host seconds per operator or kernel: finite, in [0, 1)."""
    out = _positive(value, name)
    if out >= 1:
        raise ProfileError(f"{name} must be seconds below 1, got {out!r}")
    return out


def _host(v: Any) -> HostSpeed:
    if not isinstance(v, dict):
        raise ProfileError(f"expected an object, got {type(v).__name__}")
    kernel, events = v.get("per_kernel_s", {}), v.get("per_kernel_events", {})
    if not isinstance(kernel, dict) or not isinstance(events, dict):
        raise ProfileError('per_kernel_s and per_kernel_events must be objects like {"F": ..., "B": ...}')
    unknown = sorted(set(kernel) - {"F", "B"})
    if unknown:
        raise ProfileError(f"per_kernel_s: phases are F and B, got {unknown[0]!r}")
    per_kernel = {p: _host_seconds(t, f"per_kernel_s.{p}") for p, t in kernel.items()}
    counts = {p: int(events.get(p, 0)) for p in per_kernel}
    return HostSpeed(_opt(v, "forward_op_s", _host_seconds), _opt(v, "backward_op_s", _host_seconds),
                     str(v.get("method") or ""), per_kernel, counts,
                     _opt(v, "backward_call_s", _host_seconds))  # fmt: skip
