"""Speed, size and memory of writing every GPU's trace (``simulate --all-gpus --trace``) in each format.

GPT-3 175B on DGX A100 nodes as 8M16P{D}D with 64 micro-batches under 1F1B (16 GPUs simulated, each standing for
D x 8 GPUs), written as JSON, gzip JSON, Perfetto protobuf and CSV; with --old, also as before streaming exports
(the expanded timeline built in memory, then ``json.dumps`` per event). Each case runs in its own process: it
simulates, then writes; the figures are the write's seconds (time.perf_counter), the bytes written, and the process's
peak RSS (resource.getrusage) next to its RSS after the simulation.

Run: python benchmarks/bench_trace.py [--gpus 128,512,2048,8192] [--formats json,json.gz,pftrace,csv] [--old]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import describe


def case(gpus: int, fmt: str, directory: str) -> dict[str, float]:
    """One case, in this process: simulate, then write; print a JSON line with the figures."""
    import resource
    import time
    from dataclasses import replace

    from distsim import Strategy, get_cluster, get_model, simulate
    from distsim.io.files import write_chrome_trace, write_timeline_csv
    from distsim.io.trace_export import iter_chrome_events

    cluster = replace(get_cluster("dgx-a100"), nodes=gpus // 8)
    strategy = Strategy.from_str(f"8M16P{gpus // 128}D", num_micro_batches=64, schedule="1f1b")
    r = simulate(get_model("gpt3-175b"), cluster, strategy)
    rss_sim = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    path = Path(directory) / f"trace.{'json' if fmt == 'old' else fmt}"
    t0 = time.perf_counter()
    if fmt == "csv":
        write_timeline_csv(path, r.timeline, expand=True)
    elif fmt == "old":  # before streaming exports: the expanded timeline in memory, json.dumps per event
        with open(path, "w") as fh:
            fh.write('{"displayTimeUnit":"ms","otherData":{"title":"t"},"traceEvents":[\n')
            for i, event in enumerate(iter_chrome_events(r.full_timeline())):
                fh.write((",\n" if i else "") + json.dumps(event, separators=(",", ":")))
            fh.write("\n]}\n")
    else:
        write_chrome_trace(path, r.timeline, "t", expand=True)
    seconds = time.perf_counter() - t0
    size = path.stat().st_size
    path.unlink()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"events": r.events_total, "seconds": seconds, "mb": size / 1e6, "rss_mb": rss, "rss_sim_mb": rss_sim}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default="128,512,2048", help="GPU counts, multiples of 128 (8,192: the issue's case)")
    ap.add_argument("--formats", default="json,json.gz,pftrace,csv")
    ap.add_argument("--old", action="store_true", help="also the writer before streaming exports (slow)")
    ap.add_argument("--dir", default=None, help="where the files are written (and deleted) [default: a temp dir]")
    ap.add_argument("--case", nargs=2, metavar=("GPUS", "FORMAT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        print(json.dumps(case(int(args.case[0]), args.case[1], args.dir)))
        return
    formats = args.formats.split(",") + (["old"] if args.old else [])
    print(describe())
    print("gpt3-175b on dgx-a100, 8M16P{D}D, M=64, 1F1B, simulate --all-gpus; write only, one process per case\n")
    print(f"{'GPUs':>6} {'format':<8} {'events':>12} {'seconds':>8} {'MB written':>11} {'peak RSS MB':>12} "
          f"{'(after sim)':>11}")  # fmt: skip
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        for gpus in (int(g) for g in args.gpus.split(",")):
            for fmt in formats:
                cmd = [sys.executable, __file__, "--case", str(gpus), fmt, "--dir", directory]
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                f = json.loads(done.stdout.strip().splitlines()[-1])
                name = "json old" if fmt == "old" else fmt
                print(f"{gpus:>6} {name:<8} {f['events']:>12,} {f['seconds']:>8.2f} {f['mb']:>11,.1f} "
                      f"{f['rss_mb']:>12,.0f} {f['rss_sim_mb']:>11,.0f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
