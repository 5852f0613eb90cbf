"""Measured (a distsim profile) against analytic time of every compute event of a model, and the iteration simulated
both ways: ``python benchmarks/gpu_blocks_compare.py SPEC CLUSTER PROFILE MBS`` (benchmarks/gpu_blocks.sh runs it on a
GPU). Prints one line per event: measured and analytic device time, their difference, and host launch time (measured
/ analytic)."""

from __future__ import annotations

import sys

from distsim import Strategy, simulate
from distsim.core.framework import get_framework
from distsim.io.files import load_cluster, load_model, load_profile
from distsim.sim.costs import AnalyticCosts, ComputeEvent, ProfileCosts


def main(spec: str, cluster_path: str, profile_path: str, mbs: int) -> None:
    model, cluster = load_model(spec), load_cluster(cluster_path)
    db = load_profile(profile_path)
    analytic = AnalyticCosts(cluster)
    seen: set[str] = set()
    for layer in model.layers:
        for block in layer.blocks:
            for phase in "FB":
                ev = ComputeEvent(block, phase, mbs, 1, model.precision.name)
                measured = db.compute.get(ev.key)
                if measured is None or ev.key in seen:
                    continue
                seen.add(ev.key)
                est = analytic.compute(ev)
                ms, an = measured.seconds, est.seconds
                launch = (getattr(measured, "launch_s", None) or 0.0) * 1e3
                print(f"{ev.key[:70]:70s} measured {ms * 1e3:8.3f} ms analytic {an * 1e3:8.3f} ms "
                      f"({(an / ms - 1) * 100:+6.1f} %) launch {launch:6.3f}/{est.launch_s * 1e3:6.3f} ms")  # fmt: skip
    strategy = Strategy(micro_batch_size=mbs, num_micro_batches=4)
    ideal = AnalyticCosts(cluster, framework=get_framework("ideal"))
    for name, costs in (("profile", ProfileCosts(db, AnalyticCosts(cluster))), ("analytic megatron-core", analytic),
                        ("analytic ideal", ideal)):  # fmt: skip
        r = simulate(model, cluster, strategy, costs)
        print(f"{name:24s} iteration {r.iteration_time_s * 1e3:9.2f} ms")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
