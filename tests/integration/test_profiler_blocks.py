"""Torch block modules against the simulator's Block descriptions: params, shapes, tensor-parallel equivalence with
Megatron's f/g collectives (two ranks emulated by two threads in one process), FLOPs, and compute-event timing."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from distsim.core.models.cnn import _Builder, inception_v3, resnet50
from distsim.core.models.graph import FP32, Block, Layer
from distsim.core.models.transformer import attention_block, embedding_layer, lm_head_layer, mlp_block
from distsim.profiler.blocks import (
    replicated_param_count,
    shard_param_count,
    shard_state_from_full,
    torch_dtype,
)
from distsim.profiler.build import build_block, can_build
from distsim.profiler.compute import count_flops, device_name, time_compute_event
from distsim.profiler.tp_comm import TPComm
from distsim.sim.costs import ComputeEvent
from tests.tp_shards import ThreadComm, _Rendezvous, backward, check_tp_shards, randomize, run_ranks

H, HEADS, SEQ, FFN, VOCAB, KV_SEQ = 32, 4, 8, 64, 64, 12
MBS = 2

TRANSFORMER: dict[str, Block] = {
    "attention": attention_block(H, HEADS, SEQ, FP32),
    "cross_attention": attention_block(H, HEADS, SEQ, FP32, kv_seq=KV_SEQ),
    "mlp": mlp_block(H, FFN, SEQ, FP32),
    "embedding": embedding_layer("emb", VOCAB, H, SEQ, FP32).blocks[0],
    "embedding_nopos": embedding_layer("emb", VOCAB, H, SEQ, FP32, positions=False).blocks[0],
    "lm_head": lm_head_layer("head", VOCAB, H, SEQ, FP32).blocks[0],
}


def _cnn_blocks() -> dict[str, Block]:
    """Small layers built with cnn.py's own builder (same shape tuples and params formulas), plus real layers of
    ResNet-50 (the 7x7 stride-2 stem, padding 3) and Inception-v3 (a 1x7 conv) at small image sizes."""
    b = _Builder("tiny", FP32, image=9, channels=3)
    b.conv("conv_bn", 8, 3, pad=1)
    b.conv("conv_bias", 8, 3, pad=1, bias=True, bn=False)
    b.pool("maxpool", "maxpool", 3, 2, pad=1)
    b.pool("avgpool", "avgpool", 3, 1, pad=1)
    b.bottleneck("bottleneck_down", 4, 2)
    b.bottleneck("bottleneck", 4, 1)
    b.conv("branch_a", 6, 1, src="bottleneck")
    b.conv("branch_b", 5, 1, src="bottleneck")
    b.conv("branch_c", 4, 1, src="bottleneck")
    b.concat("concat", ("branch_a", "branch_b", "branch_c"))
    b.adaptive_avgpool("adaptive", 1)
    b.linear("linear", 10)
    layers: dict[str, Layer] = {layer.name: layer for layer in b.layers}
    layers["resnet_stem"] = next(x for x in resnet50(FP32, image=64).layers if x.name == "conv1")
    layers["inception_1x7"] = next(x for x in inception_v3(FP32, image=75).layers if x.name == "Mixed_6b.branch7x7_2")
    return {name: layer.blocks[0] for name, layer in layers.items() if not name.startswith("branch")}


CNN = _cnn_blocks()
ALL = {**TRANSFORMER, **CNN}


def expected_shape(block: Block, mbs: int) -> tuple[int, ...]:
    s = dict(block.shape)
    if block.op == "lm_head":
        return ()
    if block.op in ("attention", "cross_attention", "mlp", "embedding"):
        return (mbs, s["seq"], s["h"])
    if block.op == "linear":
        return (mbs, s["out"])
    if block.op == "bottleneck":
        hw = (s["hw"] - 1) // s["stride"] + 1
        return (mbs, s["cout"], hw, hw)
    c, hw = s.get("cout", s.get("c")), s.get("out_hw", s["hw"])
    return (mbs, c, hw, hw)


# ------------------------------------------------------------------------------------------ params and shapes
@pytest.mark.parametrize("name", list(ALL))
def test_full_module_params_shapes_and_backward(name: str) -> None:
    block = ALL[name]
    module = build_block(block)
    assert module.param_count() == block.params
    inputs = module.example_inputs(MBS, torch.Generator().manual_seed(0))
    out = module(*inputs)
    assert tuple(out.shape) == expected_shape(block, MBS)
    assert torch.isfinite(out).all()
    backward(out)
    for x in inputs:
        assert x.requires_grad == x.is_floating_point()
        if x.requires_grad:
            assert x.grad is not None and x.grad.shape == x.shape
    assert all(p.grad is not None for p in module.parameters())


@pytest.mark.parametrize("name", list(TRANSFORMER))
@pytest.mark.parametrize("tp", [2, 4])
def test_shard_params_equal_block_shard_params(name: str, tp: int) -> None:
    block = TRANSFORMER[name]
    shard = build_block(block, tp, tp - 1)
    replicated = {"attention": 3 * H, "cross_attention": 3 * H, "mlp": 3 * H, "lm_head": 2 * H}
    replicated |= {"embedding": SEQ * H, "embedding_nopos": 0}
    assert replicated_param_count(block) == shard.replicated_param_count() == replicated[name]
    assert shard.param_count() == shard_param_count(block, tp)
    assert block.replicated_params == replicated[name]  # the simulator's description agrees with the module
    assert shard.param_count() == block.shard_params(tp)
    # the profiling shard (local hooks) still produces the full output shape
    assert tuple(shard(*shard.example_inputs(MBS)).shape) == expected_shape(block, MBS)


def test_lm_head_loss_is_cross_entropy() -> None:
    module = build_block(TRANSFORMER["lm_head"], dtype=torch.float64)
    randomize(module)
    x, targets = module.example_inputs(MBS)
    logits = module.proj(module.ln(x))
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    torch.testing.assert_close(module(x, targets), ref)
    (g_ref,) = torch.autograd.grad(ref, x)
    (g,) = torch.autograd.grad(module(x, targets), x)
    torch.testing.assert_close(g, g_ref)


def test_unbuildable_blocks_raise() -> None:
    for block in (Block(op="custom:x", fwd_s=1e-3), Block(op="layer", fwd_flops=1e6, params=10)):
        assert not can_build(block)
        with pytest.raises(ValueError, match=block.op):
            build_block(block)
    given = Block(op="mlp", shape=TRANSFORMER["mlp"].shape, params=TRANSFORMER["mlp"].params, fwd_s=1e-3)
    with pytest.raises(ValueError, match="given time"):
        build_block(given)
    with pytest.raises(ValueError, match="params"):
        build_block(Block(op="mlp", shape=TRANSFORMER["mlp"].shape, params=5, tp="shard"))
    with pytest.raises(ValueError, match="tp=1"):
        build_block(CNN["conv_bn"], tp=2)
    with pytest.raises(ValueError, match="heads"):
        build_block(TRANSFORMER["attention"], tp=8)
    with pytest.raises(ValueError, match="shape"):
        build_block(Block(op="mlp", shape=(("h", 4),), tp="shard"))


def test_torch_dtype() -> None:
    assert torch_dtype("fp32", "cpu") == torch.float32
    assert torch_dtype("fp16-mixed", "cpu") == torch.bfloat16
    assert torch_dtype("fp16-mixed", torch.device("cuda")) == torch.float16
    with pytest.raises(ValueError):
        torch_dtype("int8", "cpu")


# ------------------------------------------------------------------------------ tensor-parallel equivalence
def test_comm_hooks_f_and_g() -> None:
    local = TPComm.local()
    x = torch.ones(3, requires_grad=True)
    assert local.is_local and local.f(x) is x and local.g(x) is x

    def rank_fn(rank: int, comm: TPComm) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        a = torch.full((3,), float(rank + 1), requires_grad=True)
        b = torch.full((3,), float(rank + 1), requires_grad=True)
        fa, gb = comm.f(a), comm.g(b)
        (fa * (rank + 1)).sum().backward()  # each rank's partial gradient of a is rank + 1: f sums them
        (gb * (rank + 1)).sum().backward()  # g's backward is the identity
        return gb.detach(), a.grad, b.grad, comm.all_reduce_max(torch.tensor([float(rank)]))

    for rank, (gb, a_grad, b_grad, mx) in enumerate(run_ranks(2, rank_fn)):  # type: ignore[misc]
        assert not ThreadComm(_Rendezvous(1), 0).is_local
        assert gb.tolist() == [3.0] * 3
        assert a_grad.tolist() == [3.0] * 3
        assert b_grad.tolist() == [float(rank + 1)] * 3
        assert mx.tolist() == [1.0]


@pytest.mark.parametrize("name", list(TRANSFORMER))
def test_tensor_parallel_shards_match_reference(name: str) -> None:
    """tp=2 shards sliced from the tp=1 reference, collectives emulated by two threads, give the reference's output
    (or loss), input gradients, and parameter gradients (split ones equal the reference's slices)."""
    check_tp_shards(TRANSFORMER[name], 2, MBS)


def test_shard_state_slices_split_dims() -> None:
    full = build_block(TRANSFORMER["mlp"])
    for rank in range(2):
        state = shard_state_from_full(full, 2, rank)
        torch.testing.assert_close(state["fc1.weight"], full.fc1.weight.detach()[rank * 32 : (rank + 1) * 32])
        torch.testing.assert_close(state["fc2.weight"], full.fc2.weight.detach()[:, rank * 32 : (rank + 1) * 32])
        torch.testing.assert_close(state["fc2.bias"], full.fc2.bias.detach())
    with pytest.raises(ValueError):
        shard_state_from_full(build_block(TRANSFORMER["mlp"], 2, 0), 2, 0)


# -------------------------------------------------------------------------------------------------- FLOPs
FLOP_BLOCKS = ["attention", "cross_attention", "mlp", "lm_head", "conv_bn", "conv_bias", "resnet_stem"]
FLOP_BLOCKS += ["inception_1x7", "bottleneck_down", "bottleneck", "linear"]


@pytest.mark.parametrize("name", FLOP_BLOCKS)
def test_forward_flops_match_block(name: str) -> None:
    """count_flops (FlopCounterMode plus a formula for the CPU fused-attention kernel) equals block.fwd_flops."""
    block = ALL[name]
    module = build_block(block)
    inputs = module.example_inputs(MBS)
    flops = count_flops(lambda: module(*inputs))
    assert flops == pytest.approx(block.fwd_flops * MBS, rel=0.01)


def test_plain_flop_counter_may_miss_cpu_attention() -> None:
    """torch's own FlopCounterMode has no formula for the CPU fused-attention kernel: it counts the projections
    (8 s h^2) and either all of attention's 4 s^2 h or none of it, depending on the torch version."""
    block = TRANSFORMER["attention"]
    module = build_block(block)
    (x,) = module.example_inputs(MBS)
    with FlopCounterMode(display=False) as counter:
        module(x)
    projections, full = 8 * SEQ * H * H * MBS, block.fwd_flops * MBS
    assert counter.get_total_flops() in (projections, full)


# ------------------------------------------------------------------------------------------------- timing
@pytest.mark.parametrize(("name", "phase", "dtype"), [("mlp", "F", "fp32"), ("attention", "B", "fp16-mixed")])
def test_time_compute_event(name: str, phase: str, dtype: str) -> None:
    event = ComputeEvent(TRANSFORMER[name], phase, MBS, 2, dtype)
    messages: list[str] = []
    timing = time_compute_event(event, "cpu", warmup=1, repeats=3, progress=messages.append)
    assert timing.key == event.key
    assert timing.median_s > 0
    assert 0 < timing.p10_s <= timing.median_s <= timing.p90_s
    assert timing.repeats == 3
    assert timing.dtype == ("float32" if dtype == "fp32" else "bfloat16")
    assert timing.device == device_name("cpu") and timing.device
    assert timing.flops is not None
    # forward: exactly the block's share; backward: 2x forward for matmuls, flash attention recomputes its scores
    assert timing.flops == pytest.approx(event.flops, rel=0.05)
    assert messages and event.key in messages[-1]


def test_time_compute_event_cnn_backward() -> None:
    event = ComputeEvent(CNN["bottleneck"], "B", MBS, 1, "fp32")
    timing = time_compute_event(event, "cpu", warmup=1, repeats=3)
    assert timing.key == event.key and timing.median_s > 0
    assert timing.flops == pytest.approx(event.flops, rel=0.01)
