"""Judging a profile's load readings: given numbers in, warnings out (nothing here times anything)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distsim.infra.machine_load import (
    BUSY_CORES_MARGIN,
    BUSY_MARGIN,
    DRIFT_LIMIT,
    busy_warning,
    describe_load,
    extension_warning,
    load_warnings,
    recorded_warnings,
)
from tests.util import run_cli

WORKLOAD = "32 fp32 matmuls of 256x256 per round, median of 7 rounds"


def rank(r: int = 0, start: float = 0.012, end: float = 0.012, load: float = 0.1, cores: int = 2,
         threads: int | None = 1, host: str = "vm") -> dict:  # fmt: skip
    return {"rank": r, "host": host, "cores": cores, "loadavg_1m": load, "cpu_threads": threads,
            "reference_start_s": start, "reference_end_s": end}  # fmt: skip


def test_an_idle_steady_machine_gives_no_warning() -> None:
    assert load_warnings([rank(0, 0.0120, 0.0130), rank(1, 0.0125, 0.0118)]) == []  # +8 %, -6 %


def test_the_threshold_is_15_percent_either_way() -> None:
    assert DRIFT_LIMIT == 0.15
    assert load_warnings([rank(start=0.0100, end=0.0114)]) == []  # +14 %
    slower = load_warnings([rank(0, start=0.0100, end=0.0110), rank(1, start=0.0100, end=0.0116)])  # +10 %, +16 %
    assert len(slower) == 1 and "more than 15%" in slower[0] and "on rank 1 (10.0 -> 11.6 ms, +16%)" in slower[0]
    assert "rank 0" not in slower[0]
    faster = load_warnings([rank(start=0.0100, end=0.0080)])  # -20 %: the machine was loaded at the start
    assert len(faster) == 1 and "rank 0 (10.0 -> 8.0 ms, -20%)" in faster[0]
    many = load_warnings([rank(r, start=0.010, end=0.020) for r in range(6)])  # one warning, not one per rank
    assert len(many) == 1 and "rank 3 (10.0 -> 20.0 ms, +100%) and 2 more ranks" in many[0]
    assert load_warnings([rank(start=0.0100, end=0.0116)], limit=0.2) == []


def test_a_busy_machine_at_the_start_is_reported() -> None:
    # 2 cores, both taken by the profiler's ranks: any competitor shares a rank's core
    assert busy_warning(0.4, 2, 2) is None
    assert busy_warning(BUSY_MARGIN, 2, 2) is None  # the margin itself is allowed
    busy = busy_warning(1.2, 2, 2)
    assert busy is not None and "load average 1.20 on 2 cores, 2 of them used by the profiler" in busy
    assert busy_warning(1.2, 16, 2) is None  # plenty of free cores
    assert busy_warning(14.6, 16, 2) is not None
    assert busy_warning(1.2, 2, 1) is None  # one single-threaded rank leaves a core free
    assert busy_warning(None, 2, 2) is None
    # the ranks of one host share its cores: two single-threaded ranks, or one process of 2 threads, need both
    assert load_warnings([rank(0, load=1.0), rank(1, load=1.0)]) != []
    assert load_warnings([rank(0, load=1.0)]) == []
    assert load_warnings([rank(load=1.0, threads=2)]) != []
    assert load_warnings([rank(load=9.0, threads=None)]) == []  # GPU ranks are not judged by the CPU's load


def test_what_other_processes_use_now_decides_over_the_load_average() -> None:
    """The load average still counts work that ended a minute ago; the CPU others use while the ranks sleep does
    not (on this VM: 0.00-0.02 cores idle, 1.00-1.02 with one spinning process)."""
    assert busy_warning(0.57, 2, 2, busy_cores=0.02) is None  # the average remembers, the machine is idle now
    busy = busy_warning(0.1, 2, 2, busy_cores=1.01)
    assert busy is not None and "other processes used 1.01 of its 2 cores, 2 of them used by the profiler" in busy
    assert busy_warning(0.1, 2, 1, busy_cores=1.01) is None  # one single-threaded rank leaves a core free
    assert busy_warning(0.1, 2, 2, busy_cores=BUSY_CORES_MARGIN) is None  # the margin itself is allowed
    assert load_warnings([{**rank(0, load=1.0), "busy_cores": 0.0}, {**rank(1, load=1.0), "busy_cores": 0.01}]) == []
    assert load_warnings([{**rank(0, load=0.0), "busy_cores": 0.9}, {**rank(1, load=0.0), "busy_cores": 0.8}]) != []


def test_one_busy_warning_per_host_naming_it() -> None:
    ranks = [rank(0, load=0.1, host="a"), rank(1, load=1.5, host="a"), rank(2, load=0.1, host="b"),
             rank(3, load=0.1, host="b")]  # fmt: skip
    warnings = load_warnings(ranks)
    assert len(warnings) == 1 and "the machine on a was busy" in warnings[0]


def test_extending_compares_with_the_profiles_earlier_runs() -> None:
    runs = [
        {"date": "d1", "load": {"workload": WORKLOAD, "ranks": [rank(start=0.010, end=0.010)]}},
        {"date": "d2", "load": {"workload": WORKLOAD, "ranks": [rank(start=0.011, end=0.011)]}},
        {"date": "d0"},  # profiled before load was recorded
        {"date": "dx", "load": {"workload": "another workload", "ranks": [rank(start=0.100, end=0.100)]}},
    ]
    assert extension_warning(runs, WORKLOAD, 0.0113) is None  # +13 % against d1, +3 % against d2
    slower = extension_warning(runs, WORKLOAD, 0.0125)  # +25 % against d1 (the largest change)
    assert slower is not None and "now 25% slower than when the profile's run of d1" in slower
    faster = extension_warning(runs, WORKLOAD, 0.0080)
    assert faster is not None and "27% faster" in faster and "of d2" in faster
    assert extension_warning([{"date": "d0"}], WORKLOAD, 0.05) is None


def test_recorded_warnings_and_the_show_lines() -> None:
    load = {"workload": WORKLOAD, "ranks": [rank(0, 0.0120, 0.0150, load=0.25)], "warnings": ["it was busy"]}
    assert recorded_warnings({"runs": [{"date": "d1", "load": load}, {"date": "d2"}]}) == ["run of d1: it was busy"]
    assert describe_load(load) == ["rank 0 on vm: reference 12.0 ms -> 15.0 ms (+25%), load average 0.25 on 2 cores"]


@pytest.mark.parametrize("command", ["simulate", "validate"])
def test_simulate_and_validate_mention_a_profile_measured_under_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    data = json.loads(Path("profiles/validation/gpt2-cpu-2x1.json").read_text())
    data["provenance"]["runs"][0]["load"] = {"workload": WORKLOAD, "ranks": [], "warnings": ["the machine was busy"]}
    profile = tmp_path / "loaded.json"
    profile.write_text(json.dumps(data))
    if command == "simulate":
        args = ["simulate", "--model", "gpt2-cpu", "--cluster", "cpu-2x1", "--strategy", "1M2P1D", "--micro-batches",
                "4", "--profile", str(profile)]  # fmt: skip
    else:
        args = ["validate", "--trace", "traces/gpt2-cpu-2x1-1M2P1D-1f1b-M4.json", "--profile", str(profile),
                "--samples", "0"]  # fmt: skip
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    assert "measured under load" in out and "the machine was busy" in out
