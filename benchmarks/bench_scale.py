"""Whole-command speed of ``distsim simulate`` as the cluster grows (issue 24): GPT-3 175B as 8M16P{dp}D with 64
micro-batches, 1F1B, analytic costs, on DGX A100 nodes, from 1,024 to 131,072 GPUs.

Every size simulates the same tasks (one GPU per pipeline rank stands for its symmetric peers), so a command should
cost about the same at every size: the target is the 131,072-GPU command under 2 s whole and at most 1.5x the
1,024-GPU one measured in the same run. Each command runs as a fresh process (``python -m distsim simulate``), so
the figure includes the interpreter's start and the imports; the figure is the median of ``--repeats`` runs, with
the median "simulated in" the command printed and the largest peak RSS of its runs (``ru_maxrss`` of the finished
child, from ``os.wait4``). The children compile their modules once, into a bytecode cache of their own
(``PYTHONPYCACHEPREFIX``, even where ``PYTHONDONTWRITEBYTECODE`` is set), and one untimed run of each size comes
first, so that the figures are those of an installed package, not of compiling it.

With ``--full GPUS`` one more command simulates every GPU of that size (``--full``: nothing stands for its peers)
once, after the table: the acceptance figure of issue 24 is ``--full 8192`` in under 4 GB of peak RSS.

Run: python benchmarks/bench_scale.py [--repeats 5] [--gpus 1024,8192,65536,131072] [--full 8192]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from machine import describe

GPUS_PER_NODE = 8
TP, PP = 8, 16


def command(gpus: int, micro_batches: int) -> list[str]:
    dp = gpus // (TP * PP)
    return [sys.executable, "-m", "distsim", "simulate", "--model", "gpt3-175b", "--cluster", "dgx-a100",
            "--nodes", str(gpus // GPUS_PER_NODE), "--strategy", f"{TP}M{PP}P{dp}D",
            "--micro-batches", str(micro_batches)]  # fmt: skip


def child_env() -> dict[str, str]:
    """The children's environment: bytecode written to (and read from) a cache of the benchmark's own."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), "distsim-bench-pycache")
    return env


def run_once(args: list[str]) -> tuple[float, float, int]:
    """(wall seconds, the command's own 'simulated in' seconds, peak RSS in bytes) of one run of `args`: the child
    is reaped with ``os.wait4``, whose resource usage is the child's alone."""
    t0 = time.perf_counter()
    with open(os.devnull, "w") as null:
        read, write = os.pipe()
        proc = subprocess.Popen(args, stdout=write, stderr=null, text=True, env=child_env())
        os.close(write)
        chunks = []
        while chunk := os.read(read, 1 << 16):
            chunks.append(chunk)
        os.close(read)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    wall = time.perf_counter() - t0
    out = b"".join(chunks).decode()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode})")
    found = re.search(r"simulated in ([0-9.]+) s", out)
    return wall, float(found.group(1)) if found else float("nan"), usage.ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gpus", default="1024,8192,65536,131072", help="comma-separated GPU counts (multiples of 128)")
    ap.add_argument("--micro-batches", type=int, default=64)
    ap.add_argument("--full", type=int, default=0, metavar="GPUS", help="also one --full run at GPUS GPUs")
    args = ap.parse_args()
    sizes = [int(x) for x in args.gpus.split(",")]
    print(f"{describe()}; load {os.getloadavg()[0]:.2f}; median of {args.repeats} whole-process runs each")
    print(f"GPT-3 175B, 8M16P{{dp}}D, M={args.micro_batches}, 1F1B, analytic costs, dgx-a100\n")
    print(f"{'GPUs':>9} {'whole command':>14} {'simulated in':>13} {'peak RSS':>10}  vs first")
    results: dict[int, list[tuple[float, float, int]]] = {n: [] for n in sizes}
    for n in sizes:  # untimed: fills the bytecode cache and the page cache
        run_once(command(n, args.micro_batches))
    for _ in range(args.repeats):  # interleaved, so that a burst of load falls on every size alike
        for n in sizes:
            results[n].append(run_once(command(n, args.micro_batches)))
    first = None
    for n in sizes:
        wall = statistics.median(r[0] for r in results[n])
        simulated = statistics.median(r[1] for r in results[n])
        rss = max(r[2] for r in results[n])
        first = first or wall
        print(f"{n:>9,} {wall:>12.2f} s {simulated:>11.3f} s {rss / 2**20:>6.0f} MiB  {wall / first:.2f}x")
    if args.full:
        wall, simulated, rss = run_once([*command(args.full, args.micro_batches), "--full", "--max-tasks", "100000000"])
        print(f"\n--full at {args.full:,} GPUs (every GPU simulated, one run): {wall:.1f} s whole command, "
              f"{simulated:.1f} s simulated, {rss / 2**20:,.0f} MiB peak RSS")  # fmt: skip
    print(f"\nload after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
