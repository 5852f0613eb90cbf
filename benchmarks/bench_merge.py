"""Speed of the MG-WFBP search (``distsim search merge``).

1. The paper's scaling simulation: ResNet-50 in FP32 (the README's case), 32 samples per GPU, pure data parallelism
   over 2, 4, ..., 2048 single-V100 nodes (v100-10gbe resized), SyncEASGD (bulk), WFBP and MG-WFBP each simulated at
   every worker count, plus one GPU for the speedup: 34 simulations. Timed with ring all-reduce (the paper's) and with
   NCCL's ring or tree, and again with the exact merge (mgwfbp-optimal) as a fourth mode. Target: under 5 s. The sweep
   must simulate one GPU per count (symmetric replicas); the script checks that it did.
2. The mode comparison on the 16-node cluster (five modes, with the merge plans).

Run: python benchmarks/bench_merge.py [--repeats 3]
Each figure is the median wall time over the repeats, measured with time.perf_counter on this machine.
"""

from __future__ import annotations

import argparse
from typing import Any

from machine import describe, timed

from distsim import AnalyticCosts, Strategy, get_cluster, get_model
from distsim.search.merge import compare_sync, sweep_workers

WORKERS = [2**k for k in range(1, 12)]  # 2 .. 2048
TARGET_S = 5.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"{describe()}; median of {args.repeats}\n")
    model, cluster = get_model("resnet50:precision=fp32"), get_cluster("v100-10gbe")
    cases = [
        ("ring", ("bulk", "wfbp", "mgwfbp"), False),
        ("nccl", ("bulk", "wfbp", "mgwfbp"), True),
        ("ring", ("bulk", "wfbp", "mgwfbp", "mgwfbp-optimal"), False),
    ]
    for label, modes, tree in cases:

        def run(modes: tuple[str, ...] = modes, tree: bool = tree) -> Any:
            allreduce = "nccl" if tree else "ring"
            return sweep_workers(model, cluster, WORKERS, lambda c: AnalyticCosts(c, allreduce=allreduce), modes,
                                 micro_batch_size=32)  # fmt: skip

        seconds, sweep = timed(run, args.repeats)
        simulated = {p.simulated_gpus for p in sweep.points}
        assert simulated == {1}, f"expected one simulated GPU per worker count, got {sorted(simulated)}"
        sims = 1 + len(WORKERS) * len(modes)
        verdict = "ok" if seconds < TARGET_S else "OVER TARGET"
        print(f"sweep 2..2048 workers, {label:<4} all-reduce, {'/'.join(modes)}: {seconds:.2f} s for {sims} "
              f"simulations (one GPU simulated per count; target < {TARGET_S:g} s: {verdict})")  # fmt: skip
        last = sweep.points[-1]
        at = [f"{m} {last.iteration_s[m] * 1e3:.1f} ms (S = {last.speedup(m, sweep.single_gpu_s):.0f})" for m in modes]
        print("    at 2048 workers: " + ", ".join(at))
    seconds, result = timed(lambda: compare_sync(model, cluster, Strategy(dp=16, micro_batch_size=32)), args.repeats)
    print(f"\ncompare_sync, ResNet-50 on 16 nodes, {len(result.results)} modes with merge plans: {seconds:.3f} s")


if __name__ == "__main__":
    main()
