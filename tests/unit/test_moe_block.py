"""The torch module of the mixture-of-experts MLP block (distsim/profiler/moe_block.py) against its Block description:
parameters and their registration order, forward and backward, tensor-parallel shards against the full module (two
ranks emulated by threads), the routing (top-k, renormalised weights) and the shared experts against a hand-written
reference; and the executor's refusal of expert parallelism. Real torch, CPU, tiny."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from distsim import get_model
from distsim.core.errors import DistsimError
from distsim.core.models.arch import GPT, LLAMA
from distsim.core.models.graph import FP32, Block
from distsim.core.models.moe import moe_block
from distsim.core.strategy import Strategy
from distsim.executor.support import refuse_unsupported
from distsim.profiler.blocks import replicated_param_count, shard_param_count
from distsim.profiler.build import build_block
from distsim.profiler.llama_blocks import RMSNORM_EPS
from distsim.profiler.moe_block import MoEModule
from tests.sweep import check_bad_input
from tests.tp_shards import backward, check_tp_shards, randomize

H, SEQ, FFN, EXPERTS, TOP_K, SHARED = 16, 8, 12, 4, 2, 8
MBS = 2
SPEC = (f"mixtral-8x7b:layers=1,hidden={H},heads=4,kv_heads=2,seq={SEQ},vocab=64,ffn={FFN},experts={EXPERTS},"
        f"top_k={TOP_K},precision=fp32")  # fmt: skip


def _zoo_block() -> Block:
    blocks = [b for layer in get_model(SPEC).layers for b in layer.blocks if b.op == "moe"]
    assert len(blocks) == 1
    return blocks[0]


BLOCKS = {
    "mixtral": _zoo_block(),  # SwiGLU, RMSNorm, no biases
    "swiglu-shared": moe_block(H, FFN, SEQ, FP32, replace(LLAMA, experts=EXPERTS, top_k=TOP_K, shared_ffn=SHARED)),
    "gelu-bias-shared": moe_block(H, FFN, SEQ, FP32, replace(GPT, experts=EXPERTS, top_k=TOP_K, shared_ffn=SHARED)),
    "gelu-top1": moe_block(H, FFN, SEQ, FP32, replace(GPT, experts=3, top_k=1)),
}


@pytest.mark.parametrize("name", list(BLOCKS))
def test_module_matches_block(name: str) -> None:
    block = BLOCKS[name]
    module = build_block(block)
    assert isinstance(module, MoEModule)
    assert module.param_count() == block.params
    assert [p.numel() for _, p in module.named_parameters()] == [n for n, _ in block.tensors]
    assert [n in module.tp_split for n, _ in module.named_parameters()] == [s for _, s in block.tensors]
    assert replicated_param_count(block) == module.replicated_param_count() == block.replicated_params
    shard = build_block(block, 2, 1)
    assert shard.param_count() == shard_param_count(block, 2) == block.shard_params(2)
    (x,) = module.example_inputs(MBS, torch.Generator().manual_seed(0))
    out = module(x)
    assert out.shape == x.shape and torch.isfinite(out).all()
    backward(out)
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in module.parameters())


def test_the_zoo_spec_is_mixtral_shaped() -> None:
    shape = dict(BLOCKS["mixtral"].shape)
    assert (shape["experts"], shape["top_k"], shape["ffn"]) == (EXPERTS, TOP_K, FFN)
    assert shape["swiglu"] == 1 and shape["rmsnorm"] == 1 and shape["bias"] == 0 and "shared_ffn" not in shape


def test_an_expert_without_tokens_still_gets_a_gradient() -> None:
    module = build_block(BLOCKS["mixtral"], dtype=torch.float64)
    with torch.no_grad():
        module.router.weight.zero_()
        module.router.weight[1:3] = 1.0  # every token to experts 1 and 2 (positive inputs)
    x = torch.rand(MBS, SEQ, H, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) + 0.5
    backward(module(x))
    for i in (0, 3):
        assert all(p.grad is not None and not p.grad.any() for p in module.experts[i].parameters())
    assert all(p.grad is not None and p.grad.any() for p in module.experts[1].parameters())


# ------------------------------------------------------------------------------ tensor-parallel equivalence
@pytest.mark.parametrize("name", list(BLOCKS))
def test_tp2_shards_match_full_module(name: str) -> None:
    block = BLOCKS[name]
    ref_grads = check_tp_shards(block, 2, MBS)
    assert all(g is not None for g in ref_grads.values())
    # top-1 renormalised is a weight of 1 whatever the router says: its gradient is 0 (Mixtral's routing too)
    assert (ref_grads["router.weight"].abs().max() > 1e-9) == (dict(block.shape)["top_k"] > 1)


def test_tp_must_divide_the_expert_ffn() -> None:
    with pytest.raises(ValueError, match="tp=5 does not divide ffn=12"):
        build_block(BLOCKS["mixtral"], 5, 0)


# ------------------------------------------------------------------------------------- against a reference
def _expert(
    fc1_w: Tensor, fc1_b: Tensor | None, fc2_w: Tensor, fc2_b: Tensor | None, y: Tensor, swiglu: bool
) -> Tensor:
    """One expert's MLP on one token, written out: SwiGLU's fc1 rows are (gate_j, up_j) pairs."""
    z = fc1_w @ y + (0 if fc1_b is None else fc1_b)
    a = F.silu(z[0::2]) * z[1::2] if swiglu else F.gelu(z)
    return fc2_w @ a + (0 if fc2_b is None else fc2_b)


def _reference(module: MoEModule, x: Tensor) -> tuple[Tensor, list[list[int]], list[list[float]]]:
    """The block's output token by token, and each token's chosen experts and weights."""
    swiglu, out, chosen, weights = module.swiglu, torch.empty_like(x), [], []
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            y = module.ln(x[b, t])
            probs = torch.softmax(module.router.weight @ y, dim=0)
            top = sorted(range(len(probs)), key=lambda e: -float(probs[e]))[: module.top_k]
            w = [float(probs[e]) / sum(float(probs[j]) for j in top) for e in top]
            acc = x[b, t].clone()
            for e, we in zip(top, w, strict=True):
                ex = module.experts[e]
                acc = acc + we * _expert(ex.fc1.weight, ex.fc1.bias, ex.fc2.weight, ex.fc2.bias, y, swiglu)
            if module.shared is not None:
                acc = acc + _expert(module.shared.fc1.weight, None, module.shared.fc2.weight, None, y, swiglu)
            out[b, t] = acc
            chosen.append(top)
            weights.append(w)
    return out, chosen, weights


@pytest.mark.parametrize("name", list(BLOCKS))
def test_forward_matches_hand_written_reference(name: str) -> None:
    module = build_block(BLOCKS[name], dtype=torch.float64)
    assert isinstance(module, MoEModule)
    randomize(module, seed=5)
    (x,) = module.example_inputs(MBS, torch.Generator().manual_seed(4))
    with torch.no_grad():
        want, _, _ = _reference(module, x)
        torch.testing.assert_close(module(x), want)


def test_fixed_router_picks_the_experts_and_renormalises() -> None:
    """Token i is 2 e_(i mod h), a one-hot, so its RMSNorm is 2 / sqrt(4 / h + eps) e_(i mod h) and its logits are
    that times row i mod h of a table that ranks expert (i mod 4) first and (i + 1) mod 4 second."""
    module = build_block(BLOCKS["mixtral"], dtype=torch.float64)
    assert isinstance(module, MoEModule)
    randomize(module, seed=6)
    table = torch.zeros(H, EXPERTS, dtype=torch.float64)
    for j in range(H):
        table[j, j % EXPERTS], table[j, (j + 1) % EXPERTS], table[j, (j + 2) % EXPERTS] = 0.3, 0.1, 0.05
    with torch.no_grad():
        module.ln.weight.fill_(1.0)
        module.router.weight.copy_(table.T)
    x = torch.zeros(1, SEQ, H, dtype=torch.float64)
    for i in range(SEQ):
        x[0, i, i % H] = 2.0
    chosen, weights = module.route(module.ln(x).reshape(-1, H))
    logits = 2 / (4 / H + RMSNORM_EPS) ** 0.5 * table[torch.arange(SEQ) % H]
    for i in range(SEQ):
        assert chosen[i].tolist() == [i % EXPERTS, (i + 1) % EXPERTS]
        pair = logits[i, chosen[i]]
        torch.testing.assert_close(weights[i], torch.softmax(pair, dim=0))  # the two probabilities, renormalised
        assert torch.softmax(logits[i], dim=0)[chosen[i]].sum() < 0.99  # which is not what softmax gave them
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(SEQ, dtype=torch.float64))
    with torch.no_grad():
        out = module(x)
        want, ref_chosen, ref_weights = _reference(module, x)
    torch.testing.assert_close(out, want)
    assert ref_chosen == chosen.tolist()
    torch.testing.assert_close(torch.tensor(ref_weights, dtype=torch.float64), weights)


def test_shared_experts_add_their_mlp_to_every_token() -> None:
    block = BLOCKS["swiglu-shared"]
    module = build_block(block, dtype=torch.float64)
    assert isinstance(module, MoEModule) and module.shared is not None
    randomize(module, seed=7)
    (x,) = module.example_inputs(MBS, torch.Generator().manual_seed(8))
    with torch.no_grad():
        out = module(x)
        y = module.ln(x)
        gate, up = module.shared.fc1(y).unflatten(-1, (-1, 2)).unbind(-1)
        shared = (F.silu(gate) * up) @ module.shared.fc2.weight.T
        assert shared.abs().min() > 0
        module.shared.fc2.weight.zero_()
        torch.testing.assert_close(out - module(x), shared)


# ------------------------------------------------------------------------------------- expert parallelism
def test_the_executor_refuses_expert_parallelism() -> None:
    model = get_model(SPEC)
    strategy = Strategy.from_str("tp=1 pp=1 dp=2 ep=2")
    with pytest.raises(DistsimError, match="runs expert parallelism 1 only, not ep=2"):
        refuse_unsupported(model, strategy, ((0, model.num_layers),))
    refuse_unsupported(model, Strategy.from_str("tp=1 pp=1 dp=2"), ((0, model.num_layers),))


def test_execute_with_ep_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["execute", "--model", SPEC, "--cluster", "cpu-1x2", "--strategy", "tp=1 pp=1 dp=2 ep=2",
            "--emulate-nodes", "1", "--procs-per-node", "2", "--out", "{dir}/t.json"]  # fmt: skip
    check_bad_input(tmp_path, capsys, "execute ep=2", args, "distsim execute runs expert parallelism 1 only")
