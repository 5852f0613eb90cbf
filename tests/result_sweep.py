"""A fixed sweep of configurations whose every result is recorded, so that a change meant to leave the results as
they were (a speed-up of the flow builder, the placement or the metrics: issue 24) shows it changed none.

The sweep simulates a seeded set of (model, cluster, strategy, micro-batches, schedule, gradient sync, recompute,
sharding, flow options, stragglers) and takes, per configuration, the result's ``to_dict()`` (less the wall time), its
task count and a hash of its timeline (every GPU's rows expanded where the cluster has at most 64 GPUs), or the
error it raised. ``tests/data/result_sweep.json`` holds a digest of each, which ``tests/unit/test_result_sweep.py``
compares with (about 5 s). A change that means to alter results records them again:

    python -m tests.result_sweep digests tests/data/result_sweep.json

and to see which fields of which configuration changed, record everything before the change and compare after:

    python -m tests.result_sweep record /tmp/before.json
    python -m tests.result_sweep compare /tmp/before.json      # exit status 1 on any difference
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from distsim import FlowOptions, Strategy, get_cluster, get_model, simulate
from distsim.core.errors import DistsimError
from distsim.sim.costs import AnalyticCosts

BASES = [
    # model, cluster, nodes (None: the preset's), strategies (tp, pp, dp, extra)
    ("gpt2-345m", "distsim-testbed", None, [(2, 4, 2), (1, 4, 4), (4, 2, 2), (1, 1, 16), (8, 2, 1), (2, 2, 4)]),
    ("bert-large", "dapple-a", None, [(1, 2, 8), (2, 4, 2), (8, 2, 1), (1, 2, 8), (4, 1, 4)]),
    ("gpt3-1.3b", "dgx-a100", 4, [(8, 2, 2), (4, 4, 2), (2, 2, 8), (1, 4, 8), (16, 2, 1)]),
    ("t5-base", "v100-10gbe", None, [(1, 4, 4), (2, 2, 4), (1, 2, 8)]),
    ("gpt3-175b:layers=8", "dgx-a100", 16, [(8, 4, 4), (4, 8, 4), (8, 2, 8), (2, 4, 16)]),
    ("vgg16", "dapple-a", None, [(1, 1, 16), (1, 4, 4), (1, 2, 8)]),
    ("mixtral-8x7b:layers=4", "dgx-a100", 2, [(2, 2, 4, {"ep": 2}), (1, 2, 8, {"ep": 4}), (4, 2, 2, {"ep": 2})]),
    ("llama3-8b:layers=4", "dgx-a100", 2, [(2, 2, 4, {"cp": 2}), (4, 2, 2, {"cp": 2}), (2, 4, 2)]),
    ("gpt2-cpu", "cpu-2x1", None, [(1, 2, 1), (1, 1, 2), (2, 1, 1)]),
]
SCHEDULES = ["1f1b", "1f1b", "gpipe", "interleaved"]
SYNCS = ["bulk", "bulk", "wfbp", "ddp", "mgwfbp"]
RECOMPUTE = ["none", "none", "selective", "full"]
SHARDING = ["none", "none", "zero1", "zero3"]
ORDERS = ["tp,dp,pp", "tp,dp,pp", "tp,dp,pp", "tp,pp,dp", "pp,dp,tp", "dp,tp,pp"]
SHARINGS = ["structural", "structural", "structural", "serialize", "fair"]
HAND = [  # the commands the issue times, and cases that break symmetry
    ("gpt3-175b", "dgx-a100", 128, (8, 16, 8), dict(num_micro_batches=64), {}, {}),
    ("gpt3-175b", "dgx-a100", 1024, (8, 16, 64), dict(num_micro_batches=16), {}, {}),
    ("gpt2-345m", "distsim-testbed", None, (2, 4, 2), dict(num_micro_batches=4), {}, {"straggler": {3: 1.5}}),
    ("gpt2-345m", "distsim-testbed", None, (2, 2, 4), dict(num_micro_batches=4), {"symmetric": False}, {}),
    ("gpt2-345m", "distsim-testbed", None, (8, 2, 1), dict(num_micro_batches=4), {"link_sharing": "fair"}, {}),
    ("bert-large", "dapple-a", None, (2, 2, 4), dict(num_micro_batches=4), {"rank_order": "pp,tp,dp"}, {}),
    ("gpt3-1.3b", "dgx-a100", 3, (4, 3, 2), dict(num_micro_batches=6), {"rank_order": "tp,pp,dp"}, {}),
    ("gpt3-1.3b", "dgx-a100", 3, (2, 2, 6), dict(num_micro_batches=4), {"link_sharing": "fair"}, {}),
    ("gpt3-1.3b", "dgx-a100", 4, (8, 2, 2), dict(num_micro_batches=4), {"p2p_blocking": True}, {}),
    ("gpt3-1.3b", "dgx-a100", 4, (8, 4, 1), dict(num_micro_batches=8), {"link_sharing": "fair"}, {}),
]


def configurations(n: int, seed: int = 0) -> list[tuple[str, str, int | None, Strategy, FlowOptions, dict]]:
    """`n` seeded random configurations over :data:`BASES`, then the :data:`HAND` ones."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        model, cluster, nodes, shapes = rng.choice(BASES)
        tp, pp, dp, *extra = rng.choice(shapes)
        schedule = rng.choice(SCHEDULES[:3] if pp == 1 else SCHEDULES)
        m = rng.choice([1, 2, 4, 8])
        fields: dict[str, Any] = dict(extra[0]) if extra else {}
        if schedule == "interleaved":
            fields["virtual_stages"] = 2
            m = max(pp, m - m % pp)
        fields.update(tp=tp, pp=pp, dp=dp, num_micro_batches=m, schedule=schedule, grad_sync=rng.choice(SYNCS),
                      recompute=rng.choice(RECOMPUTE), optimizer_sharding=rng.choice(SHARDING),
                      micro_batch_size=rng.choice([1, 1, 2]))  # fmt: skip
        if tp > 1 and rng.random() < 0.2:
            fields["sequence_parallel"] = True
        options = FlowOptions(p2p_blocking=rng.random() < 0.15, rank_order=rng.choice(ORDERS),
                              link_sharing=rng.choice(SHARINGS), symmetric=False if rng.random() < 0.1 else None,
                              host=rng.choice([None, None, False]))  # fmt: skip
        extra_cluster = {"straggler": {rng.randrange(tp * pp * dp): 1.3}} if rng.random() < 0.08 else {}
        out.append((model, cluster, nodes, _strategy(fields), options, extra_cluster))
    for model, cluster, nodes, (tp, pp, dp), fields, opts, extra_cluster in HAND:
        out.append((model, cluster, nodes, _strategy(dict(tp=tp, pp=pp, dp=dp, **fields)), FlowOptions(**opts),
                    extra_cluster))  # fmt: skip
    return out


def _strategy(fields: dict) -> Strategy | str:
    try:
        return Strategy(**fields)
    except DistsimError as exc:
        return f"error: {type(exc).__name__}: {exc}"


def run_one(model_name: str, cluster_name: str, nodes: int | None, strategy: Strategy | str, options: FlowOptions,
            extra: dict) -> dict[str, Any]:  # fmt: skip
    """The result of one configuration as plain data (or its error)."""
    if isinstance(strategy, str):
        return {"error": strategy}
    model, cluster = get_model(model_name), get_cluster(cluster_name)
    if nodes is not None:
        cluster = cluster.with_nodes(nodes)
    try:
        if extra.get("straggler"):
            cluster = cluster.with_slowdown(extra["straggler"])
        result = simulate(model, cluster, strategy, AnalyticCosts(cluster), options, max_tasks=2_000_000)
    except DistsimError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    data = result.to_dict()
    data.pop("simulation_wall_time_s")
    data["tasks"] = len(result.flow)
    data["timeline"] = _frame_hash(result.timeline.df)
    if result.num_gpus <= 64:
        data["timeline_expanded"] = _frame_hash(result.full_timeline().df)
    return data


def _frame_hash(df: Any) -> str:
    """A hash of the timeline's recorded columns (:data:`~distsim.sim.timeline.COLUMNS`; the communication columns
    added later are checked by tests/unit/test_timeline_columns.py)."""
    import pandas as pd

    from distsim.sim.timeline import COLUMNS

    rows = df[list(COLUMNS)]
    return hashlib.sha256(pd.util.hash_pandas_object(rows, index=False).to_numpy().tobytes()).hexdigest()


def label(config: tuple) -> str:
    """The configuration in words (the key of its record): model, cluster, strategy, flow options, stragglers."""
    model, cluster, nodes, strategy, options, extra = config
    what = strategy.describe() if isinstance(strategy, Strategy) else strategy
    flow = (f"p2p_blocking={options.p2p_blocking} symmetric={options.symmetric} order={options.rank_order} "
            f"sharing={options.link_sharing} host={options.host}")  # fmt: skip
    return f"{model} on {cluster}{f' x{nodes}' if nodes else ''}: {what}; {flow}{f'; {extra}' if extra else ''}"


def digest(data: dict[str, Any]) -> str:
    """A configuration's result as a hash of its canonical JSON (floats at full precision)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def sweep(n: int = 300) -> dict[str, dict[str, Any]]:
    """Every configuration's result, by :func:`label`."""
    return {label(config): run_one(*config) for config in configurations(n)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["record", "compare", "digests"])
    ap.add_argument("path", type=Path)
    args = ap.parse_args()
    t0 = time.perf_counter()
    got = json.loads(json.dumps(sweep(), sort_keys=True))  # as a record reads back
    valid = sum("error" not in v for v in got.values())
    print(
        f"{len(got)} configurations ({valid} simulated, {len(got) - valid} refused) in {time.perf_counter() - t0:.1f} s"
    )
    if args.mode == "digests":
        args.path.write_text(json.dumps({k: digest(v) for k, v in got.items()}, indent=0, sort_keys=True) + "\n")
        return 0
    if args.mode == "record":
        args.path.write_text(json.dumps(got, indent=1, sort_keys=True))
        return 0
    before = json.loads(args.path.read_text())
    differ = [k for k in sorted(set(before) | set(got)) if before.get(k) != got.get(k)]
    for k in differ:
        old, new = before.get(k, {}), got.get(k, {})
        print(f"DIFFERS: {k}: {sorted(x for x in set(old) | set(new) if old.get(x) != new.get(x))}")
    print(f"{len(got) - len(differ)} of {len(got)} identical" + (f", {len(differ)} differ" if differ else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
