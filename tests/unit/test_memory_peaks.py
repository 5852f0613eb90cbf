"""The memory check's one pass over a rank's actions gives what the separate passes give, to the last bit."""

from __future__ import annotations

import random

import pytest

from distsim.core.schedules import build_schedule, peak_in_flight
from distsim.core.strategy import Strategy
from distsim.sim.memory import _peaks


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_one_pass_equals_the_separate_peaks(schedule: str) -> None:
    rng = random.Random(schedule)
    sched = build_schedule(Strategy(pp=4, num_micro_batches=8, schedule=schedule))
    stages = {a.stage for acts in sched.ranks for a in acts}
    kept, lost, scores = ({s: rng.uniform(1e6, 1e9) for s in stages} for _ in range(3))
    for actions in sched.ranks:
        got = _peaks(actions, kept, lost, scores)
        assert got.activations == peak_in_flight(actions, kept)
        assert got.in_flight == peak_in_flight(actions)
        assert got.unrecomputed == peak_in_flight(actions, lost)
        assert got.stages == {a.stage for a in actions}
        live = live_scores = peak = at = 0.0  # the scores in flight when kept first peaks, by hand
        for a in actions:
            sign = 1.0 if a.op == "F" else -1.0
            live += sign * kept[a.stage]
            live_scores += sign * scores[a.stage]
            if live > peak:
                peak, at = live, live_scores
        assert got.scores_at_peak == at
