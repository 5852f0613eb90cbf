"""A name that selects behaviour comes from a registry, and the CLI offers what the registry holds: registering a toy
schedule or sync mode makes it a choice of the command line and runs it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from distsim.core.schedules import SCHEDULES, gpipe, register_schedule
from distsim.core.sync import MODES
from tests.util import run_cli

SIM = ["simulate", "--model", "gpt2-cpu", "--cluster", "cpu-2x1", "--strategy", "1M2P1D", "--micro-batches", "4"]


@pytest.fixture
def toy_schedule() -> Iterator[str]:
    register_schedule("toy-gpipe", lambda pp, m, policy, max_in_flight, chunks: gpipe(pp, m))
    yield "toy-gpipe"
    del SCHEDULES["toy-gpipe"]


@pytest.fixture
def toy_sync() -> Iterator[str]:
    MODES["toy-bulk"] = MODES["bulk"]
    yield "toy-bulk"
    del MODES["toy-bulk"]


def _iteration_ms(args: list[str], capsys: pytest.CaptureFixture[str]) -> float:
    code, out, err = run_cli([*args, "--json"], capsys)
    assert code == 0, err
    return float(json.loads(out)["iteration_time_s"])


@pytest.mark.parametrize("command", ["simulate", "execute", "profile", "schedule"])
def test_a_registered_schedule_is_a_choice_of_every_command_that_takes_one(
    command: str, toy_schedule: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli([command, "--help"], capsys)
    assert code == 0 and f"gpipe|1f1b|interleaved|{toy_schedule}" in out.replace("\n", "").replace(" ", "")


def test_a_registered_schedule_runs(toy_schedule: str, capsys: pytest.CaptureFixture[str]) -> None:
    toy = _iteration_ms([*SIM, "--schedule", toy_schedule], capsys)
    assert toy == _iteration_ms([*SIM, "--schedule", "gpipe"], capsys)
    assert toy != _iteration_ms([*SIM, "--schedule", "1f1b"], capsys)  # it is the builder that ran, not a default


def test_an_unregistered_schedule_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli([*SIM, "--schedule", "toy-gpipe"], capsys)
    assert code == 2 and "'toy-gpipe' is not one of 'gpipe', '1f1b', 'interleaved'" in err


def test_a_registered_sync_mode_is_a_choice_and_runs(toy_sync: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["simulate", "--help"], capsys)
    assert code == 0 and toy_sync in out
    args = ["simulate", "--model", "gpt2-cpu", "--cluster", "cpu-1x2", "--strategy", "1M1P2D", "--grad-sync"]
    assert _iteration_ms([*args, toy_sync], capsys) == _iteration_ms([*args, "bulk"], capsys)
