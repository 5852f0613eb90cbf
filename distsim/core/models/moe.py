"""A mixture-of-experts MLP block (Mixtral, DeepSeek-MoE): a router picks ``top_k`` of ``experts`` per token; the
tokens are permuted into expert order, each expert runs its MLP on its tokens (one grouped GEMM per projection over
all the experts, as Megatron-Core's TEGroupedMLP runs them), and the outputs are weighted, unpermuted and summed;
shared experts, where there are some, run on every token beside them (Shazeer et al. 2017; Jiang et al. 2024,
"Mixtral of Experts", Sec. 2.1; Dai et al. 2024, "DeepSeekMoE", Sec. 3).

Every GPU of a tensor-parallel group holds every expert, split over tp as a dense MLP is (Megatron's expert tensor
parallelism equal to tp); expert parallelism (experts spread over GPUs, tokens exchanged by all-to-all) is not
modelled yet. The grouped GEMMs are costed as one GEMM over the routed tokens (top_k per token), which leaves out the
tile quantisation of each expert's share; with all experts on one GPU the router's load imbalance changes no time.
"""

from __future__ import annotations

from dataclasses import replace

from distsim.core.models.arch import Arch
from distsim.core.models.graph import Block, Model, Precision
from distsim.core.models.layer_ops import arch_tags, norm_op, residual_op
from distsim.core.models.ops import GemmOp, MemoryOp, Op

ROUTER_BYTES = 4
"""The router's logits and probabilities are fp32 (Megatron-Core's router casts them)."""


def moe_ops(h: int, f: int, s: int, e: int, arch: Arch) -> tuple[Op, ...]:
    """Kernels of a mixture-of-experts MLP over s tokens: norm; the router (h -> experts, every tp rank whole), its
    fp32 softmax and top-k; the permutation of top_k copies of each token into expert order (read and written);
    the experts' grouped up (gate and up for SwiGLU) projection, activation and down projection over the routed
    tokens; the unpermutation (the weighted copies read, the tokens written); the shared experts' MLP; the residual."""
    experts, k, fe, fs = arch.experts, arch.top_k, arch.expert_ffn or f, arch.shared_ffn
    up = 2 if arch.mlp == "swiglu" else 1
    routed = s * k
    act = "swiglu" if arch.mlp == "swiglu" else ("bias_gelu" if arch.bias else "gelu")
    per = 3 if arch.mlp == "swiglu" else 2  # activation bytes per hidden element: SwiGLU reads 2, writes 1
    ops: list[Op] = [
        norm_op(s, h, e, arch.norm),
        GemmOp("router", s, experts, h, "none", e),
        MemoryOp("router_topk", float(3 * s * experts * ROUTER_BYTES), reduction=True),
        MemoryOp("permute", float(2 * routed * h * e)),
        GemmOp("experts_fc1", routed, up * fe, h, "n", e),
        MemoryOp(act, float(per * routed * fe * e), tp="shard"),
        GemmOp("experts_fc2", routed, h, fe, "k", e),
        MemoryOp("unpermute", float(routed * h * e + s * h * e)),
    ]
    if fs:
        ops += [GemmOp("shared_fc1", s, up * fs, h, "n", e), MemoryOp(act, float(per * s * fs * e), tp="shard"),
                GemmOp("shared_fc2", s, h, fs, "k", e)]  # fmt: skip
    return (*ops, residual_op(s, h, e, arch.dropout))


def moe_block(h: int, f: int, s: int, p: Precision, arch: Arch) -> Block:
    """The mixture-of-experts MLP as a block: parameters of the router (h x experts, no bias), every expert's MLP
    (up and down projections, biases where the architecture has them) and the shared experts', and the norm;
    Megatron's tensor-parallel collectives around it as around a dense MLP."""
    e = p.act_bytes
    experts, fe, fs = arch.experts, arch.expert_ffn or f, arch.shared_ffn
    up = 2 if arch.mlp == "swiglu" else 1
    bias = int(arch.bias)
    expert = [(up * fe * h, True), *([(up * fe, True)] if bias else []), (fe * h, True),
              *([(h, False)] if bias else [])]  # fmt: skip
    shared = [(up * fs * h, True), (fs * h, True)] if fs else []
    tensors = (*[(h, False)] * arch.norm_params, (h * experts, False), *expert * experts, *shared)
    load = round(arch.moe_load * 100)  # in percent: a shape holds whole numbers
    shape = (("h", h), ("ffn", fe), ("seq", s), ("experts", experts), ("top_k", arch.top_k),
             *((("shared_ffn", fs),) if fs else ()), *((("load_pct", load),) if load != 100 else ()),
             *arch_tags(arch, 0, 0, attention=False))  # fmt: skip
    return Block(
        op="moe",
        shape=shape,
        params=sum(n for n, _ in tensors),
        replicated_params=sum(n for n, split in tensors if not split),
        tp="shard",
        tp_fwd_allreduce_bytes=float(s * h * e),
        tp_bwd_allreduce_bytes=float(s * h * e),
        ops=moe_ops(h, f, s, e, arch),
        tensors=tensors,
    )


def moe_kept(h: int, f: int, s: int, arch: Arch) -> tuple[float, float]:
    """(whole, split over tp) bytes a mixture-of-experts MLP keeps for backward per sequence at 2-byte activations:
    whole, the router's input (2sh) and its fp32 probabilities (4 s experts) and the permuted token copies (2 s top_k
    h); split, each routed copy's expert activations (SwiGLU 6 fe, GeLU 4 fe per copy, as a dense MLP keeps) and the
    shared experts' (the same per token)."""
    k, fe, fs = arch.top_k, arch.expert_ffn or f, arch.shared_ffn
    per = 6 if arch.mlp == "swiglu" else 4
    whole = 2 * s * h + ROUTER_BYTES * s * arch.experts + 2 * s * k * h
    return float(whole), float(per * (k * fe + fs) * s)


def expert_counts(model: Model) -> tuple[int, ...]:
    """The experts of each mixture-of-experts block of the model (empty: a dense model)."""
    return tuple(dict(b.shape)["experts"] for layer in model.layers for b in layer.blocks if b.op == "moe")


def shard_experts(model: Model, ep: int) -> Model:
    """The model as one rank of an expert-parallel group of `ep` holds it: each mixture-of-experts block keeps the
    parameters of experts/ep experts (its norm, router and shared experts whole) and is tagged ``ep`` (its event
    key, and what the flow splits around its all-to-alls). With balanced routing a rank's experts receive as many
    routed tokens from the group as it sends, so the block's kernels stay as they are. ep = 1: the model itself;
    a model already sharded stays as it is."""
    if ep == 1:
        return model
    layers = []
    for layer in model.layers:
        blocks = tuple(_shard_block(b, ep) if b.op == "moe" else b for b in layer.blocks)
        layers.append(layer if blocks == layer.blocks else replace(layer, blocks=blocks))
    return model.with_layers(tuple(layers))


def _shard_block(block: Block, ep: int) -> Block:
    shape = dict(block.shape)
    if "ep" in shape:  # already one rank's (sharding twice would divide twice)
        return block
    experts = shape["experts"]
    head = (1 if shape.get("rmsnorm") else 2) + 1  # the norm's tensors and the router
    tail = 2 if "shared_ffn" in shape else 0
    per = (len(block.tensors) - head - tail) // experts
    local = experts // ep
    tensors = (*block.tensors[:head], *block.tensors[head : head + per * local],
               *block.tensors[len(block.tensors) - tail :])  # fmt: skip
    return replace(block, shape=(*block.shape, ("ep", ep)), tensors=tensors, params=sum(n for n, _ in tensors),
                   replicated_params=sum(n for n, split in tensors if not split))  # fmt: skip
