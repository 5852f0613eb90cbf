"""The host's time per eager PyTorch operator on this machine, forward and backward.

A chain of tiny modules (LayerNorm, Linear, GELU, Linear, Dropout in turn, on a 4x8 fp32 tensor, one thread) is timed
at 10 and 50 modules; the slope between the two is the host's time per module: an ``nn.Module`` call recording
autograd (forward) and the autograd engine's node for it (backward). Each figure is the least over the repetitions
(:func:`distsim.profiler.host.measure_host_op_costs`, what ``distsim profile`` records in a profile). With --device
cuda the chain runs on the GPU and the figures include the kernel launch.

This project's 2-vCPU AMD EPYC VM measured 10.8-11.1 us forward and 14.7-14.9 us backward with such a chain; this
script, on the same kind of VM when idle, 10.3-11.3 us forward and 12.4-13.9 us backward (3 rounds of 20 repetitions,
three runs), and up to 16 us and 21 us while other processes ran on its cores: run it on an idle machine.

Run: python benchmarks/host_op_cost.py [--rounds 3 --repeats 10 --device cpu]; `taskset -c 1` in front pins it.
"""

from __future__ import annotations

import argparse

from machine import cpu_model, describe

from distsim.profiler.host import measure_host_op_costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="Independent measurements, each printed.")
    parser.add_argument("--repeats", type=int, default=10, help="Timed runs per chain length in a measurement.")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the launch included).")
    args = parser.parse_args()
    print(f"machine: {describe()}")
    forward, backward = [], []
    for i in range(args.rounds):
        costs = measure_host_op_costs(args.device, repeats=args.repeats)
        forward.append(costs.forward_s)
        backward.append(costs.backward_s)
        print(f"round {i + 1}: {costs.forward_s * 1e6:.1f} us per forward op, {costs.backward_s * 1e6:.1f} us per "
              f"backward op ({costs.method})")  # fmt: skip
    print(f"host per eager op on {cpu_model()}: forward {min(forward) * 1e6:.1f}-{max(forward) * 1e6:.1f} us, "
          f"backward {min(backward) * 1e6:.1f}-{max(backward) * 1e6:.1f} us over {args.rounds} rounds")  # fmt: skip


if __name__ == "__main__":
    main()
