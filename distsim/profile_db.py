"""The profile database: measured event durations plus alpha-beta fits, with provenance.

Schema (JSON, ``schema: distsim-profile``, ``version: 1``)::

    {
      "schema": "distsim-profile", "version": 1,
      "provenance": {"device": "...", "torch": "...", "nccl": "...", "backend": "nccl|gloo", "date": "...", ...},
      "compute": {"<compute event key>": {"median_s": 1.2e-3, "p10_s": ..., "p90_s": ..., "repeats": 20}},
      "comm": [{"collective": "all_reduce", "scope": "intra", "group_size": 2, "bytes": 1048576,
                "median_s": 2.1e-4, "p10_s": ..., "p90_s": ..., "repeats": 20}, ...],
      "fits": [{"collective": "all_reduce", "scope": "intra", "group_size": 2,
                "alpha_s": 1.5e-5, "beta_s_per_byte": 1.9e-10, "points": 8}, ...]
    }

Compute keys are ``ComputeEvent.key`` strings (see ``distsim.costs``), so the profiler and the simulator agree by
construction. Collectives are ``all_reduce``, ``all_gather``, ``reduce_scatter`` and ``p2p``; scope is ``intra`` or
``inter``. This module is pure: reading and writing files lives in ``distsim.io``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from distsim.errors import ProfileError

SCHEMA = "distsim-profile"
VERSION = 1
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "p2p")
SCOPES = ("intra", "inter")


@dataclass(frozen=True)
class Measurement:
    median_s: float
    p10_s: float | None = None
    p90_s: float | None = None
    repeats: int = 1


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


@dataclass(frozen=True)
class ProfileDB:
    provenance: dict[str, Any] = field(default_factory=dict)
    compute: dict[str, Measurement] = field(default_factory=dict)
    comm: tuple[CommMeasurement, ...] = ()
    fits: tuple[AlphaBetaFit, ...] = ()

    # ---------------------------------------------------------------------------------------------- lookups
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

    def largest_fit(self, collective: str, scope: str) -> AlphaBetaFit | None:
        cands = [f for f in self.fits if f.collective == collective and f.scope == scope]
        return max(cands, key=lambda f: f.group_size) if cands else None

    # -------------------------------------------------------------------------------------------- (de)serialise
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "provenance": dict(self.provenance),
            "compute": {
                k: {"median_s": m.median_s, "p10_s": m.p10_s, "p90_s": m.p90_s, "repeats": m.repeats}
                for k, m in sorted(self.compute.items())
            },
            "comm": [vars(m).copy() for m in self.comm],
            "fits": [vars(f).copy() for f in self.fits],
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "profile") -> ProfileDB:
        if not isinstance(data, dict):
            raise ProfileError(f"{where}: expected a JSON object at the top level")
        if data.get("schema") != SCHEMA:
            raise ProfileError(f"{where}: not a distsim profile (schema is {data.get('schema')!r}, want {SCHEMA!r})")
        if data.get("version") != VERSION:
            raise ProfileError(f"{where}: profile schema version {data.get('version')!r}; this distsim reads {VERSION}")
        try:
            compute = {str(k): _measurement(v) for k, v in dict(data.get("compute", {})).items()}
            comm = tuple(_comm(m) for m in data.get("comm", []))
            fits = tuple(_fit(f) for f in data.get("fits", []))
        except (TypeError, ValueError, KeyError) as exc:
            raise ProfileError(f"{where}: malformed entry ({exc})") from None
        return cls(dict(data.get("provenance", {})), compute, comm, fits)


def _positive(value: Any, name: str) -> float:
    v = float(value)
    if not v >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return v


def _measurement(v: Any) -> Measurement:
    return Measurement(
        median_s=_positive(v["median_s"], "median_s"),
        p10_s=None if v.get("p10_s") is None else float(v["p10_s"]),
        p90_s=None if v.get("p90_s") is None else float(v["p90_s"]),
        repeats=int(v.get("repeats", 1)),
    )


def _check_comm_fields(v: dict[str, Any]) -> tuple[str, str, int]:
    collective, scope, n = str(v["collective"]), str(v["scope"]), int(v["group_size"])
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}")
    if scope not in SCOPES:
        raise ValueError(f"scope must be intra or inter, got {scope!r}")
    if n < 2:
        raise ValueError(f"group_size must be >= 2, got {n}")
    return collective, scope, n


def _comm(v: dict[str, Any]) -> CommMeasurement:
    collective, scope, n = _check_comm_fields(v)
    m = _measurement(v)
    return CommMeasurement(collective, scope, n, int(v["bytes"]), m.median_s, m.p10_s, m.p90_s, m.repeats)


def _fit(v: dict[str, Any]) -> AlphaBetaFit:
    collective, scope, n = _check_comm_fields(v)
    return AlphaBetaFit(
        collective,
        scope,
        n,
        float(v["alpha_s"]),
        _positive(v["beta_s_per_byte"], "beta_s_per_byte"),
        int(v.get("points", 0)),
    )
