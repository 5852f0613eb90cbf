"""Speed of the simulator core.

1. GPT-3 175B on 1024 GPUs (DGX A100, 128 nodes) as 8M16P8D with 64 micro-batches under 1F1B: wall time of
   ``simulate()`` (flow build + engine) and of the headline metrics. Target: under 1 s.
2. Engine throughput with symmetry switched off (every GPU simulated): tasks and per-GPU events per second of the
   engine alone (the longest-path pass, and the SimPy simulation it is checked against), and of the whole simulate()
   call. Target: at least 300,000 events/s.
3. Fair link sharing (``--link-sharing fair``, issue 21): the same two flows built in that mode (every inter-node
   transfer a network task sharing its nodes' NICs in time), simulate() of the symmetric one, and on the flow with
   every GPU simulated the shared engine (SimPy, :func:`distsim.sim.network.run_shared`) against the longest path of
   the same flow (which ignores the sharing).

Run: python benchmarks/bench_engine.py [--repeats 5]
Each figure is the median over the repeats, measured with time.perf_counter on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

from machine import describe

from distsim import FlowOptions, Strategy, get_cluster, get_model, simulate
from distsim.sim import engine, network
from distsim.sim.costs import AnalyticCosts
from distsim.sim.flow.uniform import build_flow


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    model = get_model("gpt3-175b")
    cluster = get_cluster("dgx-a100")  # 128 nodes x 8 A100 = 1024 GPUs
    strategy = Strategy.from_str("8M16P8D", num_micro_batches=64, schedule="1f1b")
    print(f"{describe()}; {args.repeats} repeats, median\n")

    def headline() -> None:
        r = simulate(model, cluster, strategy)
        _ = (r.iteration_time_s, r.throughput_samples_per_s, r.bubble_fraction, r.peak_memory_bytes)

    r = simulate(model, cluster, strategy)
    t_sim = median_time(lambda: simulate(model, cluster, strategy), args.repeats)
    t_all = median_time(headline, args.repeats)
    print("GPT-3 175B, 8M16P8D, 1024 GPUs, M=64, 1F1B (symmetric)")
    print(
        f"  tasks simulated      {len(r.flow):,} on {len(r.flow.represents)} GPUs; "
        f"{r.events_total:,} events across 1024 GPUs, {r.events_unique} unique"
    )
    print(f"  predicted iteration  {r.iteration_time_s:.3f} s, bubble {100 * r.bubble_fraction:.1f} %")
    print(f"  simulate()           {t_sim:.3f} s")
    print(f"  + headline metrics   {t_all:.3f} s   (target < 1 s)\n")

    full_strategy = Strategy.from_str("8M16P8D", num_micro_batches=8, schedule="1f1b")
    flow = build_flow(model, cluster, full_strategy, AnalyticCosts(cluster), FlowOptions(symmetric=False))
    rows = sum(len(x) for x in flow.slots)
    t_engine = median_time(lambda: engine.run(flow.duration_s, flow.deps, flow.releases), args.repeats)
    t_simpy = median_time(lambda: engine.run_simpy(flow.duration_s, flow.deps, flow.releases), args.repeats)
    opts = FlowOptions(symmetric=False)
    t_full = median_time(lambda: simulate(model, cluster, full_strategy, options=opts).timeline, args.repeats)
    print("GPT-3 175B, 8M16P8D, 1024 GPUs, M=8, symmetry off (every GPU simulated)")
    print(f"  tasks                {len(flow):,} ({rows:,} per-GPU events)")
    print(
        f"  engine alone         {t_engine:.3f} s: {len(flow) / t_engine:,.0f} tasks/s, "
        f"{rows / t_engine:,.0f} events/s   (target >= 300,000 events/s)"
    )
    print(f"  SimPy reference      {t_simpy:.3f} s: {len(flow) / t_simpy:,.0f} tasks/s, {rows / t_simpy:,.0f} events/s")
    print(f"  whole simulate()     {t_full:.3f} s: {rows / t_full:,.0f} events/s including flow build and timeline")

    fair = FlowOptions(link_sharing="fair")
    r_fair = simulate(model, cluster, strategy, options=fair)
    t_fair = median_time(lambda: simulate(model, cluster, strategy, options=fair), args.repeats)
    print("\nFair link sharing (--link-sharing fair)")
    print(
        f"  M=64, symmetric={r_fair.flow.symmetric}: {len(r_fair.flow):,} tasks, {len(r_fair.flow.network):,} network"
    )
    print(f"  predicted iteration  {r_fair.iteration_time_s:.3f} s (structural {r.iteration_time_s:.3f} s)")
    print(f"  simulate()           {t_fair:.3f} s (structural {t_sim:.3f} s)")
    fair_full = FlowOptions(symmetric=False, link_sharing="fair")
    flow = build_flow(model, cluster, full_strategy, AnalyticCosts(cluster), fair_full)
    rows = sum(len(x) for x in flow.slots)
    shared = network.run_flow(flow)
    t_lp = median_time(lambda: engine.run(flow.duration_s, flow.deps, flow.releases), args.repeats)
    t_shared = median_time(lambda: network.run_flow(flow), args.repeats)
    alone = engine.run(flow.duration_s, flow.deps, flow.releases).makespan_s
    print(
        f"  M=8, symmetry off:   {len(flow):,} tasks ({rows:,} per-GPU events), {len(flow.network):,} network, "
        f"{len(getattr(shared, 'slowed', ())):,} slowed by sharing"
    )
    print(f"  longest path         {t_lp:.3f} s: {rows / t_lp:,.0f} events/s (ignores sharing: {alone:.3f} s)")
    print(
        f"  shared engine        {t_shared:.3f} s: {rows / t_shared:,.0f} events/s ({shared.makespan_s:.3f} s), "
        f"{t_shared / t_lp:.1f} x the longest path"
    )


if __name__ == "__main__":
    main()
