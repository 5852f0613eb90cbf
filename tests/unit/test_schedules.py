from __future__ import annotations

import pytest

from distsim import Strategy
from distsim.core.errors import ScheduleError
from distsim.core.schedules import Action, Schedule, build_schedule, format_grid, gpipe, interleaved, one_f_one_b


def test_action_grammar() -> None:
    a = Action.parse("12B3")
    assert (a.stage, a.op, a.microbatch) == (12, "B", 3) and str(a) == "12B3"
    for bad in ("1X2", "F1", "1F", "a"):
        with pytest.raises(ScheduleError, match="cannot read action"):
            Action.parse(bad)


def test_gpipe_and_1f1b_orders() -> None:
    assert [str(a) for a in gpipe(2, 2).ranks[0]] == ["0F0", "0F1", "0B0", "0B1"]
    s = one_f_one_b(3, 5)
    assert [str(a) for a in s.ranks[0]] == ["0F0", "0F1", "0F2", "0B0", "0F3", "0B1", "0F4", "0B2", "0B3", "0B4"]
    assert [str(a) for a in s.ranks[2]] == ["2F0", "2B0", "2F1", "2B1", "2F2", "2B2", "2F3", "2B3", "2F4", "2B4"]


def test_interleaved_matches_megatron_order() -> None:
    """Megatron-LM: chunks in groups of pp micro-batches; rank r warms up (pp - r - 1) * 2 + (v - 1) * pp forwards."""
    s = interleaved(2, 2, 4)
    assert [str(a) for a in s.ranks[0]] == [
        "0F0",
        "0F1",
        "2F0",
        "2F1",
        "0F2",
        "2B0",
        "0F3",
        "2B1",
        "2F2",
        "0B0",
        "2F3",
        "0B1",
        "2B2",
        "2B3",
        "0B2",
        "0B3",
    ]
    assert [str(a) for a in s.ranks[1]][:4] == ["1F0", "1F1", "3F0", "3B0"]
    assert s.stage_rank(3) == 1 and s.num_stages == 4


def test_built_schedules_are_valid_for_many_shapes() -> None:
    for pp in (1, 2, 3, 5):
        for m in (1, 2, 7):
            for sched in ("gpipe", "1f1b"):
                build_schedule(Strategy(pp=pp, num_micro_batches=m, schedule=sched))
    for pp, v, m in ((2, 2, 2), (3, 2, 9), (4, 3, 8)):
        build_schedule(Strategy(pp=pp, num_micro_batches=m, schedule="interleaved", virtual_stages=v))


@pytest.mark.parametrize(
    ("lists", "message"),
    [
        ([["0F0", "0B0", "0F0"], ["1F0", "1B0"]], "appears twice"),
        ([["0F0"], ["1F0", "1B0"]], "missing 1 actions, e.g. 0B0"),
        ([["0B0", "0F0"], ["1F0", "1B0"]], "runs 0B0 before 0F0"),
        ([["0F0", "0B0"], ["0F1", "1B0"]], "stage 0 runs on rank 0"),
        ([["0F0", "0F1", "0B1", "0B0"], ["1F1", "1B1", "1F0", "1B0"]], None),
        ([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]], "deadlocks: rank 0 at 0B0, rank 1 at 1F1"),
    ],
)
def test_schedule_validation(lists: list[list[str]], message: str | None) -> None:
    if message is None:
        Schedule.from_lists("custom", lists)
        return
    with pytest.raises(ScheduleError, match=message):
        Schedule.from_lists("custom", lists, num_stages=2)


def test_grid_shows_bubbles() -> None:
    grid = format_grid(gpipe(2, 2)).splitlines()
    assert grid[0].split() == ["step", "|", "rank", "0", "rank", "1"]
    assert grid[2].split() == ["0", "|", "0F0"]  # rank 1 idle at step 0: the bubble
    assert len(grid) == 2 + 6  # (M + S - 1) forward steps + (M + S - 1) backward steps... here 3 + 3
