"""Speed of DeepPool's planner (ALGORITHMS.md 1.7, the paper's Table 3: single-threaded Python, powers of two) and of
the whole ``distsim search deeppool`` command.

1. The planner. VGG-16 (21 layers, a chain) and Inception-v3 (120 layers, 11 branch/join blocks) on 8 GPUs (one DGX
   A100, global batch 32, the paper's setting: counts 1, 2, 4, 8) and on 1024 GPUs (128 DGX A100 nodes, global batch
   1024, so that every power of two up to 1024 is a candidate: 11 counts). Each figure is the whole
   :func:`~distsim.search.deeppool.plan_deeppool` call with a fresh analytic cost source (nothing cached between
   repeats): the cost tables (comp, comm, sync for every layer, edge and count) and the DP, also given apart.
   Targets at 1024 GPUs: VGG-16 under 0.1 s, Inception-v3 under 1 s (the paper: 0.05 s and 3.23 s).
2. The simulation of the plan found and of plain data parallelism (what the command does next), in process: the
   simulated GPUs (one per symmetric class, :mod:`distsim.plans.burst_classes`) and the seconds of both
   :func:`~distsim.simulate` calls.
3. The whole command, ``python -m distsim search deeppool --model M --cluster dgx-a100 --nodes 128 --global-batch
   1024 --plan-out ''``, as a new process each time (imports, planner, both simulations, the report). Target for
   Inception-v3 at 1024 GPUs: under 3 s (issue 24; 9.7-11 s when every GPU was simulated).

Run: python benchmarks/bench_deeppool.py [--repeats 5] [--skip-planner]
Each figure is the median wall time over the repeats, measured with time.perf_counter on this machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from machine import describe

from distsim import AnalyticCosts, get_cluster, get_model, simulate
from distsim.search.deeppool import plan_deeppool

CASES = (
    # model, nodes, global batch, target (s), the paper's time (s)
    ("vgg16", 1, 32, None, 0.01),
    ("vgg16", 128, 1024, 0.1, 0.05),
    ("inception-v3", 1, 32, None, 0.22),
    ("inception-v3", 128, 1024, 1.0, 3.23),
)
WHOLE = (
    # model, nodes, global batch, target (s)
    ("vgg16", 128, 1024, None),
    ("inception-v3", 128, 1024, 3.0),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-planner", action="store_true", help="Only the simulations and the whole command.")
    args = ap.parse_args()
    print(f"{describe()}; median of {args.repeats}\n")
    if not args.skip_planner:
        for case in CASES:
            planner(*case, repeats=args.repeats)
        print()
    for name, nodes, batch, target in WHOLE:
        simulations(name, nodes, batch, args.repeats)
        whole_command(name, nodes, batch, target, args.repeats)


def planner(name: str, nodes: int, batch: int, target: float | None, paper: float, repeats: int) -> None:
    """The planner alone, a fresh cost source each repeat."""
    model, cluster = get_model(name), get_cluster("dgx-a100").with_nodes(nodes)
    gpus = cluster.num_gpus
    totals, tables, dps = [], [], []
    for _ in range(repeats):
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


def simulations(name: str, nodes: int, batch: int, repeats: int) -> None:
    """Both plans the command simulates (the burst plan, data parallelism), as it simulates them."""
    model, cluster = get_model(name), get_cluster("dgx-a100").with_nodes(nodes)
    costs = AnalyticCosts(cluster)
    result = plan_deeppool(model, cluster, costs, cluster.num_gpus, batch)
    for which in ("best", "dp"):
        plan = result.plan(which, placement="prefix", grad_sync="bulk", model=name, cluster="dgx-a100")
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            r = simulate(model, cluster, plan, costs)
            times.append(time.perf_counter() - t0)
        print(f"{name} {'burst plan' if which == 'best' else 'data parallelism'} on {plan.num_gpus} GPUs: simulated "
              f"in {statistics.median(times) * 1e3:.1f} ms ({len(r.flow):,} tasks on {len(r.flow.represents)} "
              f"simulated GPUs), iteration {r.iteration_time_s * 1e3:.3f} ms")  # fmt: skip


def whole_command(name: str, nodes: int, batch: int, target: float | None, repeats: int) -> None:
    """The command as a user runs it: a new Python process each time, in a scratch directory, writing no plan."""
    argv = [sys.executable, "-m", "distsim", "search", "deeppool", "--model", name, "--cluster", "dgx-a100",
            "--nodes", str(nodes), "--global-batch", str(batch), "--plan-out", ""]  # fmt: skip
    times = []
    with tempfile.TemporaryDirectory() as scratch:
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run(argv, cwd=scratch, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ))
            times.append(time.perf_counter() - t0)
    goal = f" (target < {target:g} s)" if target else ""
    spread = f"{min(times):.2f}-{max(times):.2f}"
    print(f"  whole command, {name} on {nodes * 8} GPUs: {statistics.median(times):.2f} s{goal}, range {spread} s\n")


if __name__ == "__main__":
    main()
