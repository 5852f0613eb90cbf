"""One-off check that a restructuring changed no behaviour (issue 20): simulate a fixed sweep of configurations and
write, per configuration, digests of its event flow, its timeline and its result summary. Run it at two commits and
compare the two files::

    python benchmarks/compare_flows.py --out /tmp/before.json      # at the old commit
    python benchmarks/compare_flows.py --out /tmp/after.json --against /tmp/before.json

The sweep covers the three plan kinds (uniform strategies, DAPPLE-style stage plans, DeepPool burst plans), every
gradient-sync mode, every recompute mode, every optimizer sharding, the schedules, sequence parallelism, analytic and
profiled costs, symmetric and full simulations and a stochastic run. Plans are built from their file form (the
mapping a plan file holds), so the script needs no module path that a restructuring may move.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import distsim
from distsim import FlowOptions, Strategy, get_cluster, get_model, simulate

ROOT = Path(__file__).resolve().parents[1]


def _plan_from_dict(data: dict[str, Any]) -> Any:
    for module in ("distsim.plans", "distsim.plans.plan", "distsim.plan"):
        try:
            return importlib.import_module(module).plan_from_dict(data, "sweep")
        except (ImportError, AttributeError):
            continue
    raise SystemExit("no plan_from_dict found")


def _profile_costs(path: Path, cluster: Any) -> Any:
    for module in ("distsim.io.files", "distsim.io"):
        try:
            load = importlib.import_module(module).load_profile
            break
        except (ImportError, AttributeError):
            continue
    return distsim.ProfileCosts(load(path), distsim.AnalyticCosts(cluster))


def cluster_for(name: str, gpus: int, nodes: int | None = None) -> Any:
    """The preset with as many nodes as `gpus` needs (at least one)."""
    base = get_cluster(name)
    return dataclasses.replace(base, nodes=nodes or max(1, -(-gpus // base.gpus_per_node)))


def _digest(values: Any) -> str:
    return hashlib.sha256(repr(values).encode()).hexdigest()[:16]


def uniform_cases() -> Iterator[tuple[str, str, str, dict[str, Any], dict[str, Any]]]:
    """(name, model, cluster, strategy keywords, flow options)."""
    base = {"gpt2-345m": "distsim-testbed", "bert-large": "distsim-testbed", "gpt3-1.3b": "dgx-a100"}
    shapes = ["2M2P2D", "1M4P2D", "4M2P1D", "1M1P8D", "2M4P1D"]
    syncs = ["bulk", "wfbp", "ddp", "mgwfbp", "mgwfbp-optimal"]
    n = 0
    for model, cluster in base.items():
        for shape in shapes:
            for sync in syncs:
                n += 1
                kw: dict[str, Any] = {"num_micro_batches": 4, "grad_sync": sync, "schedule": ["1f1b", "gpipe"][n % 2]}
                yield f"{model} {shape} {sync} {kw['schedule']}", model, cluster, {"shape": shape, **kw}, {}
    for recompute in ("none", "selective", "full"):
        for sharding in ("none", "zero1", "zero2", "zero3"):
            kw = {"shape": "2M2P2D", "num_micro_batches": 4, "recompute": recompute, "optimizer_sharding": sharding}
            yield f"gpt2-345m recompute={recompute} sharding={sharding}", "gpt2-345m", "distsim-testbed", kw, {}
    yield "interleaved", "gpt2-345m", "distsim-testbed", {"shape": "1M4P2D", "num_micro_batches": 8,
                                                          "schedule": "interleaved"}, {}  # fmt: skip
    yield "sequence parallel", "gpt3-1.3b", "dgx-a100", {"shape": "4M2P2D", "num_micro_batches": 4,
                                                         "sequence_parallel": True}, {}  # fmt: skip
    yield "recompute_layers", "gpt3-1.3b", "dgx-a100", {"shape": "2M2P2D", "num_micro_batches": 4,
                                                        "recompute": "full", "recompute_layers": 3}, {}  # fmt: skip
    yield "policy B D=2", "bert-large", "distsim-testbed", {"shape": "1M4P2D", "num_micro_batches": 8,
                                                            "warmup_policy": "B", "max_in_flight": 2}, {}  # fmt: skip
    yield "full sim", "gpt2-345m", "distsim-testbed", {"shape": "2M2P2D", "num_micro_batches": 4}, {"symmetric": False}
    yield "p2p blocking", "gpt2-345m", "distsim-testbed", {"shape": "1M4P2D", "num_micro_batches": 4}, \
        {"p2p_blocking": True}  # fmt: skip
    yield "serialize links", "gpt2-345m", "distsim-testbed", {"shape": "2M2P2D", "num_micro_batches": 4}, \
        {"link_sharing": "serialize"}  # fmt: skip
    yield "large", "gpt3-175b", "dgx-a100", {"shape": "8M16P8D", "num_micro_batches": 16}, {}
    yield "cnn dp", "vgg16", "dgx-a100", {"shape": "1M1P8D", "num_micro_batches": 1, "micro_batch_size": 32,
                                          "grad_sync": "wfbp"}, {}  # fmt: skip
    yield "cnn pp", "resnet50", "dgx-a100", {"shape": "1M4P2D", "num_micro_batches": 4, "micro_batch_size": 8}, {}


def stages_cases() -> Iterator[tuple[str, dict[str, Any]]]:
    for model, cluster, layers in (("gpt2-345m", "distsim-testbed", 26), ("bert-large", "distsim-testbed", 26)):
        splits = [[(0, 13, "0-3"), (13, layers, "4-7")], [(0, 20, "0-6"), (20, layers, "7")],
                  [(0, 9, "0-1"), (9, 18, "2-5"), (18, layers, "6-7")], [(0, layers, "0-7")]]  # fmt: skip
        for i, split in enumerate(splits):
            for sync in ("bulk", "wfbp", "ddp", "mgwfbp", "mgwfbp-optimal"):
                for j, (recompute, sharding) in enumerate(
                    (("none", "none"), ("full", "zero1"), ("selective", "zero3"))
                ):
                    if (i + j) % 2 and sync != "bulk":
                        continue
                    data = {"model": model, "cluster": cluster, "micro_batches": 4, "micro_batch_size": 8,
                            "schedule": ["1f1b", "gpipe"][i % 2], "grad_sync": sync, "recompute": recompute,
                            "optimizer_sharding": sharding,
                            "stages": [{"layers": [a, b], "devices": d} for a, b, d in split]}  # fmt: skip
                    yield f"stages {model} {i} {sync} {recompute} {sharding}", data


def burst_cases() -> Iterator[tuple[str, dict[str, Any]]]:
    for model in ("vgg16", "resnet50", "inception-v3"):
        layers = get_model(model).num_layers
        for counts in (f"8x{layers}", f"1x{layers // 2},8x{layers - layers // 2}",
                       f"4x{layers // 3},8x{layers - 2 * (layers // 3)},2x{layers // 3}"):  # fmt: skip
            for sync in ("bulk", "wfbp"):
                data = {"kind": "burst", "model": model, "cluster": "dgx-a100", "nodes": 1, "batch": 32,
                        "grad_sync": sync, "counts": counts}  # fmt: skip
                yield f"burst {model} {counts} {sync}", data
    layers = get_model("vgg16").num_layers
    data = {"kind": "burst", "model": "vgg16", "cluster": "dgx-a100", "nodes": 1, "batch": 16,
            "layers": [{"gpus": "4-7"}] * 3 + [8] * (layers - 3)}  # fmt: skip
    yield "burst vgg16 placed", data


def summary(result: Any, with_flow: bool = True) -> dict[str, str | float]:
    flow = result.flow
    out: dict[str, str | float] = {"iteration_s": result.iteration_time_s}
    if with_flow:
        out["flow"] = _digest((flow.keys, [c.seconds for c in flow.key_costs], list(flow.key), list(flow.duration_s),
                               [list(d) for d in flow.deps], list(flow.releases)))  # fmt: skip
    out["timeline"] = _digest(result.timeline.df.to_csv(index=False))
    d = result.to_dict()
    d.pop("simulation_wall_time_s", None)
    out["result"] = _digest(json.dumps(d, sort_keys=True, default=str))
    out["memory"] = _digest([m.to_dict() for m in result.memory])
    return out


def run_all() -> dict[str, dict[str, str | float]]:
    results: dict[str, dict[str, str | float]] = {}
    profile = _profile_costs(ROOT / "profiles" / "validation" / "gpt2-cpu-1x2.json", get_cluster("distsim-testbed"))
    for name, model, cluster, kw, opts in uniform_cases():
        kw = dict(kw)
        strategy = Strategy.from_str(kw.pop("shape"), **kw)
        results[name] = summary(simulate(get_model(model), cluster_for(cluster, strategy.num_gpus), strategy,
                                         options=FlowOptions(**opts)))  # fmt: skip
    for name, data in [*stages_cases(), *burst_cases()]:
        plan = _plan_from_dict(data)
        cluster = cluster_for(data["cluster"], plan.num_gpus, data.get("nodes"))
        results[name] = summary(simulate(get_model(data["model"]), cluster, plan))
    for shape in ("1M2P2D", "2M2P1D", "1M4P1D"):
        strategy = Strategy.from_str(shape, num_micro_batches=4)
        model, cluster = get_model("gpt2-345m"), cluster_for("distsim-testbed", strategy.num_gpus)
        results[f"profile {shape}"] = summary(simulate(model, cluster, strategy, costs=profile))
    strategy = Strategy.from_str("1M2P2D", num_micro_batches=4)
    cluster = cluster_for("distsim-testbed", 4)
    stochastic = simulate(get_model("gpt2-345m"), cluster, strategy, costs=profile, samples=3, seed=7)
    results["stochastic"] = summary(stochastic)
    results["stochastic"]["samples"] = _digest(np.round(stochastic.sampled_iteration_s, 12).tolist())
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--against", type=Path, help="an earlier output to compare with")
    args = parser.parse_args()
    results = run_all()
    args.out.write_text(json.dumps(results, indent=1, sort_keys=True))
    print(f"{len(results)} configurations written to {args.out}")
    if args.against is None:
        return 0
    before = json.loads(args.against.read_text())
    differ = [k for k in sorted(set(before) | set(results)) if before.get(k) != results.get(k)]
    for k in differ:
        print(f"DIFFERS {k}: {before.get(k)} -> {results.get(k)}")
    print(f"{len(results) - len(differ)} of {len(results)} identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
