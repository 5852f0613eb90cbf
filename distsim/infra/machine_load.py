"""Was the machine loaded while it was profiled? Judging the reference timings a profile records (pure).

Every profiling rank times a fixed reference workload (:mod:`distsim.profiler.reference`) when it starts and when it
ends, and reads the 1-minute load average, its usable cores and the CPU other processes use (while every rank sleeps
for half a second) at the start. The profile keeps them per rank in
``provenance.load`` (the latest run) and in each ``provenance.runs[].load``::

    {"workload": "32 fp32 matmuls of 256x256 per round, median of 7 rounds", "drift_limit": 0.15,
     "ranks": [{"rank": 0, "host": "vm", "cores": 2, "loadavg_1m": 0.12, "busy_cores": 0.01, "cpu_threads": 1,
                "reference_start_s": 0.0121, "reference_end_s": 0.0124}, ...],
     "warnings": ["..."]}

The judgement is here, on given numbers, so that it is tested without timing anything.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

DRIFT_LIMIT = 0.15
"""Largest change of a rank's reference time (end against start, or a new run against an earlier one) that is not
reported. Measured on this project's 2-core VM (one rank pinned to a core, 10 readings each): idle, 11.9 to 13.5 ms
(13 % apart); a busy process on the same core, 28 to 39 ms (median 2.1x the idle 16.0 ms of that moment); other
users' load (load average ~4), 27 to 41 ms. 15 % is above an idle machine's spread and below what any competitor
does, and a profile 15 % slow mispredicts by about as much, twice the 8 % batch-time target. (This VM's own speed also
wanders by more than 15 % within seconds, see the README; the warning then says so truthfully.)"""
BUSY_MARGIN = 0.5
"""Load average allowed above the cores the profiler's own ranks leave free before the machine counts as busy at the
start. The kernel's 1-minute average moves by 1 - exp(-5/60) = 0.08 per runnable process every 5 s: the launcher
and the ranks importing torch for a few seconds add about 0.25, while one competing process that has run for a minute
adds 0.63 (and 1 when it keeps running)."""


BUSY_CORES_MARGIN = 0.25
"""Cores' worth of CPU that other processes may use, beyond the cores the profiler's ranks leave free, while the
ranks sleep in the same half second at the start (:func:`distsim.profiler.reference.other_cpu_use`). Measured on this
project's VM: idle 0.00-0.02; one spinning process 1.00-1.02. Unlike the load average, which still counts work that
ended a minute ago, this reads what competes now."""


def busy_warning(loadavg_1m: float | None, cores: int | None, needed_cores: int, host: str = "",
                 margin: float = BUSY_MARGIN, busy_cores: float | None = None) -> str | None:  # fmt: skip
    """A warning when other work competed for the cores at the start, or None.

    With `busy_cores` (the CPU other processes used while the ranks slept, in cores) the machine is busy when that
    exceeds the cores left over by the profiler's own ranks (`needed_cores`: the threads of its ranks) plus
    :data:`BUSY_CORES_MARGIN`. Without it, when the 1-minute load average exceeds those cores plus `margin`.
    """
    if cores is None:
        return None
    free = max(cores - needed_cores, 0)
    used = f"{min(needed_cores, cores)} of them used by the profiler"
    where = f" on {host}" if host else ""
    if busy_cores is not None:
        if busy_cores <= free + BUSY_CORES_MARGIN:
            return None
        what = f"other processes used {busy_cores:.2f} of its {cores} cores, {used}"
    else:
        if loadavg_1m is None or loadavg_1m <= free + margin:
            return None
        what = f"load average {loadavg_1m:.2f} on {cores} cores, {used}"
    return (f"the machine{where} was busy when profiling started: {what}; compute timings are likely slow (profile "
            "an idle machine)")  # fmt: skip


def drift_warning(readings: Iterable[tuple[int, float | None, float | None]], limit: float = DRIFT_LIMIT,
                  shown: int = 4) -> str | None:  # fmt: skip
    """One warning naming the ranks whose reference time moved by more than `limit` (relative) between the start
    and the end of profiling, from (rank, start_s, end_s) readings; None if none did."""
    moved = [(r, a, b, b / a - 1) for r, a, b in readings if a and b and abs(b / a - 1) > limit]
    if not moved:
        return None
    listed = ", ".join(f"rank {r} ({a * 1e3:.1f} -> {b * 1e3:.1f} ms, {c:+.0%})" for r, a, b, c in moved[:shown])
    more = f" and {len(moved) - shown} more ranks" if len(moved) > shown else ""
    return (f"the reference workload's time moved by more than {limit:.0%} between the start and the end of "
            f"profiling on {listed}{more}: the machine's speed changed while it was profiled (other work on its "
            "cores), so events measured at different times do not agree")  # fmt: skip


def load_warnings(ranks: Iterable[dict[str, Any]], limit: float = DRIFT_LIMIT,
                  margin: float = BUSY_MARGIN) -> list[str]:  # fmt: skip
    """Every warning the per-rank readings of one run call for: busy hosts at the start (judged for CPU ranks, those
    that record ``cpu_threads``; the ranks of one host name share its cores), then ranks whose reference time
    drifted."""
    ranks = list(ranks)
    warnings: list[str] = []
    hosts: dict[str, list[dict[str, Any]]] = {}
    for r in ranks:  # emulated nodes share their machine's host name, and its cores
        hosts.setdefault(str(r.get("host", "")), []).append(r)
    for host, here in hosts.items():
        cpu = [r for r in here if r.get("cpu_threads")]  # GPU ranks: the load average says little of their speed
        if not cpu:
            continue
        needed = sum(int(r["cpu_threads"]) for r in cpu)
        busiest = max(cpu, key=lambda r: (r.get("busy_cores") or 0, r.get("loadavg_1m") or 0))
        message = busy_warning(busiest.get("loadavg_1m"), busiest.get("cores"), needed,
                               host if len(hosts) > 1 else "", margin, busiest.get("busy_cores"))  # fmt: skip
        if message:
            warnings.append(message)
    readings = [(int(r.get("rank", 0)), r.get("reference_start_s"), r.get("reference_end_s")) for r in ranks]
    moved = drift_warning(readings, limit)
    if moved:
        warnings.append(moved)
    return warnings


def run_reference_s(load: dict[str, Any] | None) -> float | None:
    """One run's reference time: the mean over its ranks of their start and end readings (None if not recorded)."""
    if not load:
        return None
    values = [
        v for r in load.get("ranks", []) for v in (r.get("reference_start_s"), r.get("reference_end_s")) if v
    ]  # fmt: skip
    return statistics.fmean(values) if values else None


def extension_warning(runs: Iterable[dict[str, Any]], workload: str, now_s: float,
                      limit: float = DRIFT_LIMIT) -> str | None:  # fmt: skip
    """A warning when this run's reference time (`now_s`, mean over its ranks at the start) differs by more than
    `limit` from an earlier run's of the profile being extended (the one that differs most), or None.

    Only runs that timed the same `workload` are compared.
    """
    worst: tuple[float, dict[str, Any], float] | None = None
    for run in runs:
        load = run.get("load") or {}
        then = run_reference_s(load) if load.get("workload") == workload else None
        if not then:
            continue
        change = now_s / then - 1
        if worst is None or abs(change) > abs(worst[0]):
            worst = (change, run, then)
    if worst is None or abs(worst[0]) <= limit:
        return None
    change, run, then = worst
    faster = "slower" if change > 0 else "faster"
    return (f"this machine is now {abs(change):.0%} {faster} than when the profile's run of {run.get('date', '?')} "
            f"was measured (reference workload {now_s * 1e3:.1f} ms against {then * 1e3:.1f} ms, more than "
            f"{limit:.0%}): the events measured now will not agree with the profile's earlier ones")  # fmt: skip


def recorded_warnings(provenance: dict[str, Any]) -> list[str]:
    """The load warnings a profile's runs recorded, each prefixed with its run's date."""
    out = []
    for run in provenance.get("runs", []):
        for message in (run.get("load") or {}).get("warnings", []):
            out.append(f"run of {run.get('date', '?')}: {message}")
    return out


def describe_load(load: dict[str, Any]) -> list[str]:
    """Lines for ``distsim profile show``: per rank the reference before and after, the load average and cores."""
    lines = []
    for r in load.get("ranks", []):
        start, end = r.get("reference_start_s"), r.get("reference_end_s")
        ref = " -> ".join(f"{v * 1e3:.1f} ms" for v in (start, end) if v)
        change = f" ({end / start - 1:+.0%})" if start and end else ""
        host = f" on {r['host']}" if r.get("host") else ""
        avg, busy = r.get("loadavg_1m"), r.get("busy_cores")
        machine = f", load average {avg:.2f} on {r.get('cores', '?')} cores" if avg is not None else ""
        machine += f", others using {busy:.2f} cores at the start" if busy is not None else ""
        lines.append(f"rank {r.get('rank', '?')}{host}: reference {ref}{change}{machine}")
    return lines
