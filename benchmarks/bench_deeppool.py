"""Speed of DeepPool's planner (ALGORITHMS.md 1.7, the paper's Table 3: single-threaded Python, powers of two).

VGG-16 (21 layers, a chain) and Inception-v3 (120 layers, 11 branch/join blocks) on 8 GPUs (one DGX A100, global
batch 32, the paper's setting: counts 1, 2, 4, 8) and on 1024 GPUs (128 DGX A100 nodes, global batch 1024, so
that every power of two up to 1024 is a candidate: 11 counts). Each figure is the whole
:func:`~distsim.search.deeppool.plan_deeppool` call with a fresh analytic cost source (nothing cached between
repeats): the cost tables (comp, comm, sync for every layer, edge and count) and the DP, also given apart.
Targets at 1024 GPUs: VGG-16 under 0.1 s, Inception-v3 under 1 s (the paper: 0.05 s and 3.23 s).

Run: python benchmarks/bench_deeppool.py [--repeats 5]
Each figure is the median wall time over the repeats, measured with time.perf_counter on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

from machine import describe

from distsim import AnalyticCosts, get_cluster, get_model
from distsim.search.deeppool import plan_deeppool

CASES = (
    # model, nodes, global batch, target (s), the paper's time (s)
    ("vgg16", 1, 32, None, 0.01),
    ("vgg16", 128, 1024, 0.1, 0.05),
    ("inception-v3", 1, 32, None, 0.22),
    ("inception-v3", 128, 1024, 1.0, 3.23),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"{describe()}; median of {args.repeats}\n")
    for name, nodes, batch, target, paper in CASES:
        model, cluster = get_model(name), get_cluster("dgx-a100").with_nodes(nodes)
        gpus = cluster.num_gpus
        totals, tables, dps = [], [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            result = plan_deeppool(model, cluster, AnalyticCosts(cluster), gpus, batch)
            totals.append(time.perf_counter() - t0)
            tables.append(result.best.tables_s)
            dps.append(result.best.planning_s)
        best, dp = result.best, result.dp
        goal = f"target < {target:g} s, " if target else ""
        print(f"{name} on {gpus} GPUs, global batch {batch}, counts {','.join(map(str, best.counts))}: "
              f"{statistics.median(totals) * 1e3:.1f} ms ({goal}paper {paper:g} s) = cost tables "
              f"{statistics.median(tables) * 1e3:.1f} ms + DP {statistics.median(dps) * 1e3:.1f} ms")  # fmt: skip
        runs = ", ".join(f"{a}-{b}: {g}" if a != b else f"{a}: {g}" for a, b, g in best.runs())
        runs = runs if len(runs) <= 160 else runs[:157] + "..."
        dp_text = f"{dp.time_s * 1e3:.2f} ms, {dp.gpu_seconds:.3f} GPU-s" if dp else "-"
        print(f"  plan {best.time_s * 1e3:.2f} ms, {best.gpu_seconds:.3f} GPU-s (DP over all {gpus}: {dp_text}); "
              f"{len(best.runs())} runs of layers: {runs}")  # fmt: skip


if __name__ == "__main__":
    main()
