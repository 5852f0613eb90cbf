"""The executor's activation recomputation and ZeRO-1: the same training step as the single-process reference (loss,
gradients, parameters after the step) and the simulator's events, in its order.

The parameters after Adam's first step are compared where the reference gradient is well above Adam's epsilon: there
the step is lr * sign(g); where a gradient is zero in exact arithmetic (a key bias: softmax ignores it) it is
rounding noise, and Adam's g / (|g| + eps) turns any two noises into different steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from distsim import Strategy, get_cluster, simulate  # noqa: E402
from distsim.core.models import get_model  # noqa: E402
from distsim.core.partition import ranges  # noqa: E402
from distsim.core.placement import Placement  # noqa: E402
from distsim.core.schedules import build_schedule  # noqa: E402
from distsim.executor.reference import reference_step  # noqa: E402
from distsim.executor.runtime import Runtime  # noqa: E402
from distsim.executor.zero import padded_layout  # noqa: E402
from distsim.sim.flow.recompute import eligible_layers  # noqa: E402

TINY = "gpt2-345m:seq=16,layers=2,hidden=32,heads=4,vocab=64,precision=fp32"
ODD = "gpt2-345m:seq=16,layers=2,hidden=33,heads=3,vocab=64,precision=fp32"
"""Layer norms of 33 elements: DDP buckets of odd sizes, which ZeRO-1 pads to a multiple of dp."""
STEP_KINDS = ("forward", "recompute", "backward", "optimizer")


def assert_same_step(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Loss, gradients and the parameters after the step (see the module) as the reference's."""
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert set(got["grads"]) == set(want["grads"]) and set(got["params"]) == set(want["params"])
    for name, g in want["grads"].items():
        torch.testing.assert_close(got["grads"][name], g, rtol=1e-4, atol=1e-6, msg=name)
    sure = total = 0
    for name, p in want["params"].items():
        clear = want["grads"][name].abs() > 1e-6
        torch.testing.assert_close(got["params"][name][clear], p[clear], rtol=0, atol=1e-7, msg=name)
        sure, total = sure + int(clear.sum()), total + p.numel()
    assert sure > total / 2  # most of the step is checked


def compute_order(rows: list[tuple[Any, ...]]) -> list[tuple[str, str, int, int, int]]:
    """(kind, name, layer, stage, micro-batch) of a GPU's compute rows in start order, a block split around its
    tensor-parallel collectives counted once."""
    rows = sorted(rows, key=lambda r: r[0])
    return [key for key, _ in groupby(r[1:] for r in rows if r[1] in STEP_KINDS)]


def simulated(model: Any, cluster: Any, strategy: Strategy) -> Any:
    return simulate(model, cluster, strategy).timeline.expand().df


def sim_rows(df: Any, gpu: int, stream: str) -> list[tuple[Any, ...]]:
    mine = df[(df["gpu"] == gpu) & (df["stream"].astype(str) == stream)]
    return [(s, str(k), str(n), int(la), int(st), int(m)) for s, k, n, la, st, m in
            zip(mine["start_s"], mine["kind"], mine["name"], mine["layer"], mine["stage"], mine["microbatch"],
                strict=True)]  # fmt: skip


# ------------------------------------------------------------------------------------------------ one process
def test_padded_layout_pads_each_bucket_to_a_multiple_of_the_group_and_keeps_every_tensor_in_it() -> None:
    # tensors of 3, 4, 5, 2 elements; buckets in backward order: [t3, t2] (7 elements) and [t1, t0] (7)
    spans = {(0, 0): (0, 3), (0, 1): (3, 7), (1, 0): (7, 12), (1, 1): (12, 14)}
    buckets = [(slice(7, 14), [(1, 1), (1, 0)]), (slice(0, 7), [(0, 1), (0, 0)])]
    new, parts, total = padded_layout(spans, buckets, 2)
    assert parts == [slice(8, 16), slice(0, 8)] and total == 16  # each 7 -> 8, order in the buffer kept
    assert new == {(0, 0): (0, 3), (0, 1): (3, 7), (1, 0): (8, 13), (1, 1): (13, 15)}
    new3, parts3, total3 = padded_layout(spans, buckets, 3)
    assert parts3 == [slice(9, 18), slice(0, 9)] and total3 == 18 and new3[(1, 0)] == (9, 14)
    assert padded_layout(spans, buckets, 1) == (spans, [slice(7, 14), slice(0, 7)], 14)  # nothing to pad
    with pytest.raises(AssertionError, match="in no bucket"):
        padded_layout(spans, buckets[:1], 2)


@pytest.mark.parametrize("layers", [None, 1])
def test_full_recomputation_in_one_process_is_the_reference_step_with_the_simulators_events(layers: int | None) -> None:
    """One rank, GPipe over 2 micro-batches: the transformer layers (not the embedding or the LM head, the
    simulator's rule) run forward without a graph, then again as ``recompute`` events right before their backward;
    the step is the reference's, and the compute stream's events are the simulator's, in its order."""
    model, cluster = get_model(TINY), get_cluster("cpu-1x2")
    strategy, one, runtime = one_rank(model, "full", layers)
    expected = [i for i, ok in enumerate(eligible_layers(model, "full")) if ok][:layers]
    assert sorted(runtime.recomputed) == expected == ([1, 2] if layers is None else [1])
    got: dict[str, Any] = {}

    def named(value: Any) -> dict[str, Any]:
        return {f"L{li}.B{bi}.{n}": value(p).detach().clone() for (li, bi), m in runtime.modules.items()
                for n, p in m.named_parameters()}  # fmt: skip

    def before() -> None:
        got.update(grads=named(lambda p: p.grad), loss=sum(runtime.losses) / len(runtime.losses))

    def after() -> None:
        got["params"] = named(lambda p: p)

    runtime.run_iteration(0, lambda: None, before_step=before, after_step=after)
    assert_same_step(got, reference_step(model, cluster, strategy))
    rows = [(r[6], *r[1:6]) for _it, r in runtime.recorder.rows if r[0] == "compute"]
    sim = simulated(model, one, strategy)
    assert compute_order(rows) == compute_order(sim_rows(sim, 0, "compute"))
    recomputed = [r for r in compute_order(rows) if r[0] == "recompute"]
    assert {r[2] for r in recomputed} == set(expected) and len(recomputed) == 2 * 2 * len(expected)  # 2 blocks, 2 mb


def one_rank(model: Any, recompute: str, layers: int | None = None) -> tuple[Strategy, Any, Runtime]:
    """A 1-rank runtime of `model` (GPipe, 2 micro-batches of 2) in this process, its strategy and cluster."""
    cluster = get_cluster("cpu-1x2")
    strategy = Strategy(micro_batch_size=2, num_micro_batches=2, schedule="gpipe", partition=(model.num_layers,),
                        recompute=recompute, recompute_layers=layers)  # fmt: skip
    one = cluster.with_nodes(1).__class__(**{**cluster.__dict__, "nodes": 1, "gpus_per_node": 1, "slowdown": ()})
    runtime = Runtime(model, strategy, Placement(strategy, one), build_schedule(strategy), ranges(strategy.partition),
                      0, {}, torch.float32, torch.device("cpu"))  # fmt: skip
    return strategy, one, runtime


def test_a_recomputed_layers_forward_keeps_nothing_for_backward() -> None:
    """The tensors autograd saves for backward during one forward action: fewer with each recomputed layer (the
    embedding's and the LM head's remain)."""

    def saved(recompute: str, layers: int | None = None) -> int:
        runtime = one_rank(get_model(TINY), recompute, layers)[2]
        runtime._prefetch(0)
        count = [0]

        def pack(t: Any) -> Any:
            count[0] += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            runtime.forward(0, 0, 0, {})
        return count[0]

    assert saved("none") > saved("full", 1) > saved("full") > 0


def test_a_plan_files_recomputation_reaches_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`distsim execute --plan` (one rank, in this process) runs the plan's recompute fields: the trace's plan keeps
    them and only the first transformer layer is recomputed."""
    from tests.util import run_cli

    plan, out = tmp_path / "p.plan.yaml", tmp_path / "t.json"
    plan.write_text(
        f'model: "{TINY}"\ncluster: cpu-2x1\nnodes: 1\n'
        'strategy: "tp=1 pp=1 dp=1 mbs=2 mb=2 schedule=gpipe recompute=full recompute_layers=1"\n'
    )
    threads = torch.get_num_threads()
    try:
        code, _, err = run_cli(["execute", "--plan", str(plan), "--iterations", "1", "--warmup", "0", "--out",
                                str(out)], capsys)  # fmt: skip
    finally:
        torch.set_num_threads(threads)  # the rank takes this process's cores
    assert code == 0, err
    trace = json.loads(out.read_text())
    ran = Strategy.from_str(trace["plan"]["strategy"])
    assert (ran.recompute, ran.recompute_layers) == ("full", 1)
    cols = trace["iterations"][0]["columns"]
    recomputed = {n for k, n in zip(cols["kind"], cols["name"], strict=True) if k == "recompute"}
    assert recomputed == {"layer0.attention", "layer0.mlp"}


# ---------------------------------------------------------------------------------------- two gloo processes
def distsim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "distsim", *args], capture_output=True, text=True, timeout=900,
                          env=dict(os.environ))  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "strategy", "extra"),
    [
        (TINY, "1M2P1D", ["--schedule", "1f1b", "--recompute", "full"]),  # the tied LM head on the other stage
        (TINY, "2M1P1D", ["--recompute", "full", "--recompute-layers", "1"]),  # layer0 recomputed, layer1 not
        (ODD, "1M1P2D", ["--optimizer-sharding", "zero1", "--recompute", "full", "--recompute-layers", "1",
                         "--grad-sync", "ddp", "--bucket-cap-mb", "0.002"]),  # 10 buckets, some of odd sizes
    ],
)  # fmt: skip
def test_two_ranks_with_recomputation_and_zero1_take_the_reference_step_with_the_simulators_events(
    tmp_path: Path, model: str, strategy: str, extra: list[str]
) -> None:
    """Two gloo ranks train as one process does, and record the simulator's events: recomputed forwards (with their
    tensor-parallel all-reduces) right before their layer's backward, and under ZeRO-1 each bucket's reduce-scatter
    (``dp``) then, after the sharded step, its parameter all-gather (``gather``), with the simulator's names."""
    check, out = tmp_path / "check.pt", tmp_path / "trace.json"
    run = distsim("execute", "--model", model, "--cluster", "cpu-1x2", "--strategy", strategy, "--micro-batches", "2",
                  "--micro-batch-size", "2", *extra, "--emulate-nodes", "1", "--procs-per-node", "2",
                  "--iterations", "1", "--warmup", "0", "--check", str(check), "--out", str(out))  # fmt: skip
    assert run.returncode == 0, run.stderr
    trace = json.loads(out.read_text())
    planned = Strategy.from_str(trace["plan"]["strategy"])
    assert planned.recompute == "full" and planned.optimizer_sharding == ("zero1" if "zero1" in extra else "none")
    m, cluster = get_model(model), get_cluster("cpu-1x2")
    assert_same_step(torch.load(check), reference_step(m, cluster, planned))
    sim = simulated(m, cluster, planned)
    cols = trace["iterations"][0]["columns"]
    rows = list(zip(cols["gpu"], cols["stream"], cols["start_s"], cols["kind"], cols["name"], cols["layer"],
                    cols["stage"], cols["microbatch"], strict=True))  # fmt: skip
    for gpu in (0, 1):
        mine = {s: [r[2:] for r in rows if r[0] == gpu and r[1] == s] for s in ("compute", "tp", "dp", "gather")}
        order = compute_order(mine["compute"])
        assert order == compute_order(sim_rows(sim, gpu, "compute"))
        assert any(r[0] == "recompute" for r in order)
        if planned.tp > 1:  # the recomputed forward's all-reduces run again
            assert any(r[1] == "tp_allreduce" and (r[2], r[3], r[5]) in {(x[1], x[2], x[4]) for x in order
                       if x[0] == "recompute"} for r in mine["tp"])  # fmt: skip
        for stream in ("dp", "gather"):
            names = [r[2] for r in sorted(mine[stream])]
            assert names == [r[2] for r in sorted(sim_rows(sim, gpu, stream))]
            buckets = [n for n in names if n.startswith(("grads", "params"))]  # not the tied copies' all-reduce
            assert bool(buckets) == (planned.dp > 1 and (stream == "dp" or planned.optimizer_sharding == "zero1"))
    if planned.optimizer_sharding == "zero1":
        assert "reduce-scatter" in trace["provenance"]["notes"]["reduce_scatter"]
