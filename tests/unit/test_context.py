"""Context parallelism: sequences split over cp GPUs, ring attention's key/value passes overlapped with the
attention, the global batch and memory that follow."""

from __future__ import annotations

from dataclasses import replace

import pytest

from distsim import Strategy, get_cluster, get_model, simulate
from distsim.core.errors import DistsimError
from distsim.core.models.context import split_context
from distsim.core.models.ops import AttentionOp, GemmOp
from distsim.core.strategy import check_strategy
from distsim.plans.simulate import estimate_size
from distsim.sim.flow.events import K_CP, FlowOptions
from tests.util import hand_cluster


def test_a_rank_holds_its_share_of_each_sequence() -> None:
    """cp=4 on seq 8192: every GEMM runs 2048 tokens; attention 2048 queries against half of the 8192 keys (the
    causal triangle balanced over the ranks), unmasked; kept activations and the tp collectives a quarter."""
    model = get_model("llama3-8b:layers=2,seq=8192")
    split = split_context(model, 4)
    attention = split.layers[1].blocks[0]
    assert all(op.m == 2048 for op in attention.ops if isinstance(op, GemmOp))
    core = next(op for op in attention.ops if isinstance(op, AttentionOp))
    assert (core.q_len, core.kv_len, core.causal) == (2048, 4096, False)
    assert split.layers[1].saved_sharded_bytes == model.layers[1].saved_sharded_bytes / 4
    assert attention.tp_fwd_allreduce_bytes == model.layers[1].blocks[0].tp_fwd_allreduce_bytes / 4
    assert dict(attention.shape)["seq"] == 2048 and ("cp", 4) in attention.shape
    assert split.params == model.params and split_context(split, 4) is split


def test_the_global_batch_counts_each_shared_sequence_once() -> None:
    assert Strategy(dp=8, cp=2, num_micro_batches=4, micro_batch_size=2).global_batch_size == 4 * 4 * 2
    with pytest.raises(DistsimError, match="cp=3 must divide dp=4"):
        Strategy(dp=4, cp=3)


def _ring_run(inter_bw: float) -> tuple[object, float]:
    """cp=2 across two single-GPU nodes joined at `inter_bw`: each ring step sends the rank's K and V chunk."""
    model = get_model("llama3-8b:layers=1,seq=4096,hidden=1024,heads=8,kv_heads=8,ffn=2816")
    cluster = replace(hand_cluster(2, 1, inter_bw=inter_bw), gpu=get_cluster("dgx-h100").gpu)
    return simulate(model, cluster, Strategy(dp=2, cp=2)), model


def test_the_ring_is_exposed_only_where_a_transfer_outlasts_a_step() -> None:
    """A fast link: every chunk arrives while the previous one is attended to, nothing exposed. A slow link: the
    two steps take A/2 + T, so T - A/2 is exposed, T the K and V chunk (2 x 2048 x 1024 x 2 bytes) at the link's
    rate, and slower links are never faster."""
    fast, _ = _ring_run(1e15)
    assert all(fast.flow.duration_s[i] == 0 for i, k in enumerate(fast.flow.kind) if k == K_CP)
    slow, _ = _ring_run(1e9)
    rings = [i for i, k in enumerate(slow.flow.kind) if k == K_CP]
    chunk = 2 * 2048 * 1024 * 2
    forward = next(i for i in rings if slow.flow.name[i].endswith("ring") and slow.flow.duration_s[i] > 0)
    key = slow.flow.keys[slow.flow.key[forward]]
    assert f"bytes={chunk}" in key or f"bytes={2 * chunk}" in key
    assert all(slow.flow.duration_s[i] > 0 for i in rings)
    times = [_ring_run(bw)[0].iteration_time_s for bw in (1e8, 1e9, 1e10, 1e15)]
    assert times == sorted(times, reverse=True)


def test_context_parallelism_divides_the_memory_of_long_sequences() -> None:
    model = get_model("llama3-8b:layers=4,seq=32768")
    cluster = get_cluster("dgx-h100").with_nodes(1)
    peaks = [simulate(model, cluster, Strategy(tp=2, dp=4, cp=cp, sequence_parallel=True)).peak_memory_bytes
             for cp in (1, 2, 4)]  # fmt: skip
    assert peaks[0] > peaks[1] > peaks[2]


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("symmetric", [None, False])
def test_the_task_estimate_counts_the_rings(recompute: str, symmetric: bool | None) -> None:
    model = get_model("llama3-8b:layers=2,seq=4096")
    cluster = get_cluster("dgx-h100").with_nodes(1)
    strategy = Strategy(tp=2, dp=4, cp=2, num_micro_batches=2, recompute=recompute, sequence_parallel=True)
    options = FlowOptions(symmetric=symmetric)
    r = simulate(model, cluster, strategy, options=options)
    assert estimate_size(model, cluster, strategy, options=options)[0] == len(r.flow)
    assert r.iteration_time_s == pytest.approx(simulate(model, cluster, strategy).iteration_time_s)


@pytest.mark.parametrize(
    ("spec", "strategy", "needle"),
    [
        ("resnet50", Strategy(dp=8, cp=2), "has no attention to split"),
        ("t5-base", Strategy(dp=8, cp=2), "encoder-decoder"),
        ("gpt2-345m:attention=unfused", Strategy(dp=8, cp=2), "stored-score attention"),
        ("gpt2-345m:seq=1002", Strategy(dp=8, cp=2), "must split into 2 x cp = 4 equal chunks"),
        ("mixtral-8x7b:layers=2", lambda: Strategy(dp=8, cp=2, ep=2), "context and expert parallelism together"),
    ],
)
def test_what_context_parallelism_cannot_split_is_one_line(spec: str, strategy: object, needle: str) -> None:
    with pytest.raises(DistsimError, match=needle):
        check_strategy(strategy() if callable(strategy) else strategy, get_model(spec),
                       get_cluster("dgx-h100").with_nodes(1))  # fmt: skip


def test_a_launch_line_with_context_parallelism() -> None:
    from distsim.core.megatron import parse_megatron_args

    line = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
            "--group-query-attention --num-query-groups 8 --seq-length 65536 --position-embedding-type rope "
            "--normalization RMSNorm --swiglu --untie-embeddings-and-output-weights --disable-bias-linear "
            "--attention-dropout 0 --hidden-dropout 0 --vocab-size 128256 --context-parallel-size 4 "
            "--tensor-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 16 --bf16")  # fmt: skip
    job = parse_megatron_args(line)
    assert job.strategy["cp"] == 4 and job.degrees(64) == (8, 1, 8, 8)  # 8 replicas, 2 sequences at once


def test_the_grid_tries_context_parallel_degrees_at_the_same_global_batch() -> None:
    from distsim.search.grid import GridSpec, grid_search

    cluster = get_cluster("dgx-h100").with_nodes(1)
    spec = GridSpec(gpus=8, global_batch=8, micro_batch_sizes=(1,), tp_degrees=(2,), pp_degrees=(1,),
                    cp_degrees=(1, 2, 4))  # fmt: skip
    r = grid_search(get_model("llama3-8b:layers=2,seq=16384"), cluster, spec, workers=1)
    assert {(p.strategy.cp, p.strategy.global_batch_size) for p in r.points} == {(1, 8), (2, 8), (4, 8)}
    assert "cp" in r.table().columns


def test_the_executor_refuses_context_parallelism() -> None:
    from distsim.executor.support import refuse_unsupported

    with pytest.raises(DistsimError, match="not context parallelism cp=2"):
        refuse_unsupported(get_model("gpt2-cpu"), Strategy(dp=2, cp=2), ((0, 6),))
