"""The executor runs a micro-batch as a training loop does (one backward call per micro-batch and stage) and times
each block inside that call with autograd hooks: hand-built chains and a tensor with two consumers, the runtime's
call count with and without recomputation, and where recomputed blocks land (one process, fast)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from distsim import Strategy, get_cluster  # noqa: E402
from distsim.core.models import get_model  # noqa: E402
from distsim.core.partition import ranges  # noqa: E402
from distsim.core.placement import Placement  # noqa: E402
from distsim.core.schedules import build_schedule  # noqa: E402
from distsim.executor.backward import BackwardTimer  # noqa: E402
from distsim.executor.recorder import Recorder  # noqa: E402
from distsim.executor.runtime import Runtime  # noqa: E402

TINY = "gpt2-345m:seq=16,layers=3,hidden=32,heads=4,vocab=64,precision=fp32"


def _key(name: str, li: int, bi: int = 0) -> tuple[Any, int]:
    return (("compute", "backward", name, li, 0, 0), bi)


def _rows(rec: Recorder) -> list[tuple[str, str, float, float]]:
    rec.finish(0)
    return [(r[2], r[1], r[6], r[7]) for _it, r in rec.rows]


def test_a_chain_of_blocks_is_timed_inside_one_backward_call() -> None:
    rec = Recorder()
    rec.begin(0)
    ended: list[tuple[int, int]] = []
    hooks = BackwardTimer(rec, lambda li, bi: ended.append((li, bi)))
    emb, fc1, fc2 = torch.nn.Embedding(10, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)
    ids = torch.tensor([1, 2, 3])
    x = hooks.watch(_key("embedding", 0), [ids], lambda a: emb(*a))
    x = hooks.watch(_key("fc1", 1), [x], lambda a: torch.relu(fc1(*a)))
    loss = hooks.watch(_key("fc2", 2), [x], lambda a: fc2(*a).sum())
    with hooks.call():
        torch.autograd.backward(loss)
    rows = _rows(rec)
    # last block first; the embedding (no input needing a gradient, so no tap) ends at the call's end
    assert [r[0] for r in rows] == ["fc2", "fc1", "embedding"]
    assert all(r[1] == "backward" for r in rows)
    assert all(s <= e for _n, _k, s, e in rows)
    assert all(e <= s2 for (*_a, e), (_n, _k, s2, _e) in itertools.pairwise(rows))  # one stream, no overlap
    assert ended == [(2, 0), (1, 0), (0, 0)]
    # every block's gradients exist when its end is reported (the runtime issues buckets there)
    assert all(p.grad is not None for m in (emb, fc1, fc2) for p in m.parameters())
    assert hooks.overhead.blocks == {"forward": 3, "backward": 3}
    assert set(hooks.overhead.per_block_us()) == {"forward", "backward"}


def test_a_chained_block_without_a_tap_ends_where_the_block_before_it_starts() -> None:
    rec = Recorder()
    rec.begin(0)
    ended: list[tuple[int, int]] = []
    hooks = BackwardTimer(rec, lambda li, bi: ended.append((li, bi)))
    fc1, fc2, fc3 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    x = torch.randn(2, 4, requires_grad=True)  # a received activation: tapped
    y = hooks.watch(_key("fc1", 0), [x], lambda a: fc1(*a))
    y = hooks.watch(_key("fc2", 1), [y], lambda a: fc2(*a), chained=True)
    loss = hooks.watch(_key("fc3", 2), [y], lambda a: fc3(*a).sum(), chained=True)
    with hooks.call():
        torch.autograd.backward(loss)
    rows = _rows(rec)
    assert [r[0] for r in rows] == ["fc3", "fc2", "fc1"]
    assert [b[2] for b in rows[1:]] == [a[3] for a in rows[:-1]]  # each ends at the next one's start mark
    assert ended == [(2, 0), (1, 0), (0, 0)] and x.grad is not None
    assert hooks.overhead.blocks == {"forward": 3, "backward": 3}


def test_the_runtime_chains_a_transformers_blocks() -> None:
    runtime = _runtime()
    # every layer after the embedding reads only the one before it (the embedding, first, reads token ids)
    assert runtime.chained == frozenset(range(1, runtime.model.num_layers))
    # with full recomputation only the first transformer layer: a recomputed layer's output carries no hook
    assert _runtime("full").chained == frozenset({1})


def test_a_tensor_with_two_consumers_starts_its_producer_after_both() -> None:
    rec = Recorder()
    rec.begin(0)
    hooks = BackwardTimer(rec, lambda li, bi: None)
    w0, wa, wb = (torch.randn(4, 4, requires_grad=True) for _ in range(3))
    x = torch.randn(2, 4, requires_grad=True)
    h = hooks.watch(_key("producer", 0), [x], lambda a: a[0] @ w0)
    ya = hooks.watch(_key("a", 1), [h], lambda a: a[0] @ wa)
    yb = hooks.watch(_key("b", 2), [h], lambda a: a[0] @ wb)
    with hooks.call():
        torch.autograd.backward([ya.sum() + yb.sum()])
    rows = {r[0]: r for r in _rows(rec)}
    assert set(rows) == {"producer", "a", "b"}
    # the producer's backward starts once both consumers have handed it their gradients
    assert rows["producer"][2] >= max(rows["a"][3], rows["b"][3])
    assert x.grad is not None and torch.allclose(x.grad, (torch.ones(2, 4) @ (wa.T + wb.T)) @ w0.T)


def _runtime(recompute: str = "none", m: int = 3) -> Runtime:
    model, cluster = get_model(TINY), get_cluster("cpu-1x2")
    strategy = Strategy(micro_batch_size=2, num_micro_batches=m, partition=(model.num_layers,), recompute=recompute)
    one = cluster.with_nodes(1).__class__(**{**cluster.__dict__, "nodes": 1, "gpus_per_node": 1, "slowdown": ()})
    return Runtime(model, strategy, Placement(strategy, one), build_schedule(strategy), ranges(strategy.partition),
                   0, {}, torch.float32, torch.device("cpu"))  # fmt: skip


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_the_runtime_calls_backward_once_per_micro_batch(monkeypatch: pytest.MonkeyPatch, recompute: str) -> None:
    runtime = _runtime(recompute)
    calls: list[int] = []
    real = torch.autograd.backward

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "backward", counting)
    runtime.run_iteration(0, lambda: None)
    # a reentrant checkpoint runs one nested call per recomputed layer inside the micro-batch's own call
    assert len(calls) == 3 * (1 + len(runtime.recomputed))
    assert len(runtime.recomputed) == (0 if recompute == "none" else 3)  # the transformer layers
    assert len(runtime.losses) == 3


def test_recomputed_blocks_run_inside_the_backward_right_before_their_own() -> None:
    runtime = _runtime("full", m=1)
    runtime.run_iteration(0, lambda: None)
    rows = sorted((r for _it, r in runtime.recorder.rows), key=lambda r: r[6])
    assert all(e <= s2 for a, b in itertools.pairwise(rows) for e, s2 in [(a[7], b[6])])  # no overlap
    backward = [(r[1], r[3]) for r in rows if r[1] in ("backward", "recompute")]
    layers = sorted(runtime.recomputed)
    for li in layers:
        first, n = backward.index(("recompute", li)), _blocks(runtime, li)
        # the layer's blocks recomputed, then their backward, after the later layers' backward
        assert backward[first : first + 2 * n] == [("recompute", li)] * n + [("backward", li)] * n
        assert all(layer > li for kind, layer in backward[:first] if kind == "backward")
    # recompute rows only in the backward: each recomputed layer's blocks once
    recomputes = [r for r in rows if r[1] == "recompute"]
    assert len(recomputes) == sum(_blocks(runtime, li) for li in layers)


def _blocks(runtime: Runtime, li: int) -> int:
    return len(runtime.model.layers[li].blocks)


def test_the_hooks_add_an_overhead_the_trace_can_state() -> None:
    runtime = _runtime(m=2)
    runtime.run_iteration(0, lambda: None)
    blocks = sum(len(layer.blocks) for layer in runtime.model.layers)
    assert runtime.hooks.overhead.blocks == {"forward": 2 * blocks, "backward": 2 * blocks}
    per_block = runtime.hooks.overhead.per_block_us()
    assert set(per_block) == {"forward", "backward"} and all(v > 0 for v in per_block.values())
