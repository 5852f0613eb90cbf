"""Speed of the search drivers.

1. DistSim grid search for GPT-3 175B on 1024 GPUs (DGX A100, 128 nodes), global batch 1536: tp in 1, 2, 4, 8,
   every pp dividing the 96 layers and the GPU count, micro-batch sizes 1, 2, 4, 8, schedules GPipe, 1F1B and
   interleaved. Timed three times: as shipped (configurations that do not fit in 80 GB are not simulated), with
   --ignore-memory (every valid configuration simulated), and with the recomputation (none, selective, full) and
   optimizer-sharding (none, zero1) dimensions added under the memory filter. Target: under 30 s each (issue 24:
   the last under 10 s with 2 workers). Then one prediction: the grid's own time per simulated configuration, and
   simulate() in this process of each configuration that grid simulated, each timed alone (median and 90th
   percentile; issue 24's target: a median under 20 ms).
2. DAPPLE's planner for BERT-48 (bert-exlarge, 50 graph layers) on 16 GPUs (2 machines x 8 V100, dapple-a),
   global batch 64, every micro-batch count, the three placement policies, serial and with the workers.
   Target: under 10 s. Then the simulation of its shortlist.

Run: python benchmarks/bench_search.py [--workers 2] [--repeats 3]
Each figure is the median wall time over the repeats, measured with time.perf_counter on this machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from machine import describe, timed

from distsim import AnalyticCosts, get_cluster, get_model
from distsim.plans.simulate import simulate
from distsim.search.dapple import DappleSpec, check_with_simulator, plan_dapple
from distsim.search.grid import GridResult, GridSpec, grid_search
from distsim.search.space import cluster_for


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"{describe()}; {args.workers} workers, median of {args.repeats}\n")

    model, cluster = get_model("gpt3-175b"), get_cluster("dgx-a100")
    costs = AnalyticCosts(cluster)
    plain = ("none",), ("none",)
    scale = ("none", "selective", "full"), ("none", "zero1")
    for memory_filter, (recompute, sharding) in ((True, plain), (False, plain), (True, scale)):
        spec = GridSpec(
            gpus=1024, global_batch=1536, micro_batch_sizes=(1, 2, 4, 8), schedules=("gpipe", "1f1b", "interleaved"),
            tp_degrees=(1, 2, 4, 8), memory_filter=memory_filter, recompute_modes=recompute, sharding_modes=sharding,
        )  # fmt: skip
        t, result = timed(lambda s=spec: grid_search(model, cluster, s, costs, workers=args.workers), args.repeats)
        best = result.best(1)
        what = "memory filter on" if memory_filter else "--ignore-memory"
        if recompute != plain[0]:
            what += ", --recompute none,selective,full --optimizer-sharding none,zero1"
        print(f"GPT-3 175B grid, 1024 GPUs ({what}): {len(result.points)} valid, {len(result.skipped)} skipped, "
              f"{result.num_out_of_memory} out of memory, {result.num_simulated} simulated: {t:.2f} s "
              f"(target < 30 s); best {best[0].strategy.describe() if best else '-'}")  # fmt: skip
        if recompute != plain[0]:
            predictions(result, costs)

    model, cluster = get_model("bert-exlarge"), get_cluster("dapple-a")
    costs = AnalyticCosts(cluster)
    spec = DappleSpec(gpus=16, global_batch=64)
    for workers in sorted({1, args.workers}):
        t, result = timed(lambda w=workers: plan_dapple(model, cluster, spec, costs, workers=w), args.repeats)
        b = result.best
        print(f"DAPPLE planner, BERT-48 on 2 x 8 V100, global batch 64, {workers} worker(s): {result.evaluated:,} "
              f"plans scored over {len(result.best_per_micro_batches)} micro-batch counts in {t:.2f} s "
              f"(target < 10 s); planner's best {b.notation} at M={b.micro_batches}")  # fmt: skip
    t_check, checked = timed(lambda: check_with_simulator(result, costs), 1)
    print(f"  simulating the shortlist ({len(checked)} plans x warm-up policies A and B): {t_check:.2f} s")


def predictions(result: GridResult, costs: AnalyticCosts) -> None:
    """One prediction, two ways: the grid's own time per simulated configuration (its memory check, simulation and
    metrics, in a worker with the collector paused: GridPoint.simulation_s), and simulate() in this process for
    every configuration the grid simulated, each call timed alone with its metrics (as a user's loop runs it: the
    collector runs after each call)."""
    inside = [p.simulation_s for p in result.points if p.simulated]
    cluster = cluster_for(result.cluster, result.spec.gpus)  # what grid_search simulates on
    times = []
    for p in result.points:
        if p.simulated:
            t0 = time.perf_counter()
            _ = simulate(result.model, cluster, p.strategy, costs).bubble_fraction
            times.append(time.perf_counter() - t0)
    for what, got in (("inside the grid", inside), ("simulate() alone", times)):
        q90 = statistics.quantiles(got, n=10)[-1] if len(got) > 1 else got[0]
        print(f"  one prediction, {what} ({len(got)} configurations): median {1e3 * statistics.median(got):.1f} ms, "
              f"90th percentile {1e3 * q90:.1f} ms (target: median < 20 ms)")  # fmt: skip


if __name__ == "__main__":
    main()
