"""The shipped artifacts stay usable: the CPU profile covers what README and validation simulate, strictly."""

from __future__ import annotations

from pathlib import Path

import pytest

from distsim import FlowOptions, Strategy, get_cluster, get_model, simulate
from distsim.io.files import load_profile
from distsim.sim.costs import AnalyticCosts, ProfileCosts

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "profiles" / "cpu-gloo.json"


@pytest.mark.parametrize("model", ["gpt2-cpu", "bert-cpu", "t5-cpu"])
@pytest.mark.parametrize(("cluster", "strategies"), [("cpu-1x2", ["1M2P1D", "1M1P2D", "2M1P1D"]),
                                                      ("cpu-2x1", ["1M2P1D", "1M1P2D"])])  # fmt: skip
@pytest.mark.parametrize("mbs", [1, 2])
def test_cpu_profile_covers_the_validation_plans(model: str, cluster: str, strategies: list[str], mbs: int) -> None:
    db = load_profile(PROFILE)
    assert db.provenance["backend"] == "gloo"
    c = get_cluster(cluster)
    for text in strategies:
        for schedule in ("gpipe", "1f1b"):
            strategy = Strategy.from_str(text, num_micro_batches=8, micro_batch_size=mbs, schedule=schedule)
            r = simulate(get_model(model), c, strategy, ProfileCosts(db, AnalyticCosts(c), strict=True),
                         FlowOptions())  # fmt: skip
            assert r.iteration_time_s > 0 and "analytic" not in r.source_counts()
