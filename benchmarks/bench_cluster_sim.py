"""Speed of the cluster-trace simulation (``distsim cluster-sim``).

A 1,000-job synthetic trace (``distsim.elastic.synth.generate(1000, seed=0)``: Poisson arrivals 20 s apart on
average, 1-16 GPU gangs each requiring a GPU type of YARN-CS, log-normal runtimes) on 64 GPUs (V100:32, P100:16,
T4:16), simulated under YARN-CS, EasyScale-homo and EasyScale (each with the Eq. 1 planner as its throughput
estimate, memoised within one run only, so every plan is computed). Target: under 10 s for each.

Measured only when /tmp/distsim-bench does not exist (another benchmark is not running): the script creates it while
it measures and deletes it after.

Run: python benchmarks/bench_cluster_sim.py [--repeats 3]
Each figure is the median wall time over the repeats, measured with time.perf_counter on this machine.
"""

from __future__ import annotations

import argparse
import os
import sys

from machine import describe, timed

from distsim.elastic.cluster_sim import simulate_cluster
from distsim.elastic.synth import generate

GPUS = {"V100": 32, "P100": 16, "T4": 16}
TARGET_S = 10.0
LOCK = "/tmp/distsim-bench"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    try:
        os.mkdir(LOCK)
    except FileExistsError:
        sys.exit(f"{LOCK} exists: another benchmark is measuring; run again when it is gone")
    try:
        jobs = generate(1000, seed=0)
        print(f"{describe()}; median of {args.repeats}; {len(jobs)} jobs on {sum(GPUS.values())} GPUs\n")
        for name in ("yarn-cs", "easyscale-homo", "easyscale"):

            def run(name: str = name) -> object:
                return simulate_cluster(jobs, GPUS, name)

            seconds, res = timed(run, args.repeats)
            verdict = "ok" if seconds < TARGET_S else "OVER TARGET"
            print(f"{name:<15} {seconds:6.2f} s (target < {TARGET_S:g} s: {verdict}); JCT mean {res.jct_mean_s:.0f} s, "
                  f"makespan {res.makespan_s:.0f} s, {len(res.grants)} grants")  # fmt: skip
    finally:
        os.rmdir(LOCK)


if __name__ == "__main__":
    main()
