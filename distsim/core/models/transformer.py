"""Transformer workloads (BERT, GPT-2/3, T5) with Megatron-style tensor-parallel splits.

Per-sample forward FLOPs of one layer follow Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", Sec. 5.1: 24 s h^2 + 4 s^2 h per layer, i.e. attention 8 s h^2 + 4 s^2 h and MLP
16 s h^2 with f = 4h). Activation memory kept for backward follows Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", Sec. 4.1 and 4.2.1): s b h (10 + 24/t + 5 a s / (h t)) bytes per layer
with 2-byte activations and tensor parallelism t, without sequence parallelism or recomputation, when the attention
core stores its s x s scores (``unfused``, ``fused_softmax``); with flash attention (the default) the 5as^2 term is
replaced by the core's fp32 log-sum-exp statistics, 4as: the attention kernel is a choice of the model
(:data:`~distsim.core.models.ops.ATTENTION_IMPLS`, ``attention=``), and a layer's time and memory both follow it,
since the layer's activation figures are read from the attention ops its blocks run (:func:`with_attention` rewrites
both together).

Megatron's tensor parallelism (Shoeybi et al. 2019, Fig. 3) needs one all-reduce of the block output (s h elements
per sample) after the attention block and after the MLP block in forward, and one each in backward.

Every block also lists its kernels (``Block.ops``, :mod:`distsim.core.models.ops`) for the analytic cost model:
Megatron's layer (Korthikanti et al. 2022, Sec. 4.1) as layer norm, QKV GEMM, the attention core (flash, or the
stored-score kernels), output projection, bias + dropout + residual; layer norm, two MLP GEMMs around the bias + GeLU,
bias + dropout + residual; the embedding gather; the LM head's GEMM and its fp32 vocab-parallel cross-entropy.
``fwd_flops`` and ``io_bytes`` are the sums over those ops.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from distsim.core.checks import positive_int
from distsim.core.errors import ModelFileError
from distsim.core.models.arch import GPT, Arch
from distsim.core.models.graph import FP16_MIXED, MAX_LAYERS, Block, Layer, Model, Precision
from distsim.core.models.layer_ops import arch_tags, norm_op, residual_op
from distsim.core.models.moe import moe_block, moe_kept
from distsim.core.models.ops import (
    ATTENTION_IMPLS,
    AttentionOp,
    GemmOp,
    MemoryOp,
    Op,
    attention_op_name,
    check_attention_impl,
    fp8_ops,
)


def check_dims(dims: Mapping[str, Any], where: str) -> dict[str, int]:
    """Transformer dimensions (layers, hidden, heads, seq, vocab, ffn, dec_seq; None: not given) as positive
    integers, layers at most MAX_LAYERS and hidden divisible by heads (each head gets hidden/heads dimensions).
    Errors name `where`, the key and the value."""
    out = {k: positive_int(v, f"{where}: {k}", ModelFileError, MAX_LAYERS if k == "layers" else None)
           for k, v in dims.items() if v is not None}  # fmt: skip
    if "hidden" in out and "heads" in out and out["hidden"] % out["heads"]:
        raise ModelFileError(
            f"{where}: hidden ({out['hidden']}) must be divisible by heads ({out['heads']}), "
            "as each attention head gets hidden/heads dimensions"
        )
    return out


def pad_vocab(vocab: int, multiple: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of 128 so that it splits over tensor-parallel ranks."""
    return -(-vocab // multiple) * multiple


def attention_ops(
    h: int, a: int, s: int, e: int, kv_seq: int | None = None, causal: bool = True, attention: str = "flash",
    arch: Arch = GPT,
) -> tuple[Op, ...]:  # fmt: skip
    """Megatron's attention block as kernels: layer norm (or RMSNorm), QKV projection (column-parallel; with
    grouped-query attention Q of h and K, V of kv_heads x head_dim each), rotary embeddings on Q and K (rope), the
    attention core (heads split) run by `attention` (flash, unfused or fused_softmax), output projection
    (row-parallel), bias + dropout + residual (or the residual add alone). A cross-attention block projects Q from
    the decoder's s tokens and K, V from the encoder's kv_seq positions, unmasked."""
    name = attention_op_name(attention)
    d = h // a
    rope: tuple[Op, ...] = ()
    if kv_seq is None:
        kv = arch.groups(a)
        projections: tuple[Op, ...] = (GemmOp("qkv", s, (a + 2 * kv) * d, h, "n", e),)
        core = AttentionOp(name, a, d, s, s, causal, e, attention)
        if arch.position == "rope":  # reads and writes Q and K; its backward rotates the gradients back
            rope = (MemoryOp("rope", float(2 * s * (a + kv) * d * e), tp="shard", bwd_factor=1.0),)
    else:
        projections = (GemmOp("q", s, h, h, "n", e), GemmOp("kv", kv_seq, 2 * h, h, "n", e))
        core = AttentionOp(name, a, d, s, kv_seq, False, e, attention)
    return (norm_op(s, h, e, arch.norm), *projections, *rope, core, GemmOp("proj", s, h, h, "k", e),
            residual_op(s, h, e, arch.dropout))  # fmt: skip


def attention_shape_tag(attention: str) -> tuple[tuple[str, int], ...]:
    """What an attention block's shape (its event key) adds for its kernel: nothing for flash (the keys profiles
    already hold), ``(impl, 1)`` for a stored-score kernel, e.g. ``attention[h=1024,heads=16,seq=1024,unfused=1]``,
    so a profile's flash measurement never stands for another kernel."""
    return () if attention == "flash" else ((attention, 1),)


def attention_block(
    h: int,
    a: int,
    s: int,
    p: Precision,
    kv_seq: int | None = None,
    causal: bool = True,
    attention: str = "flash",
    arch: Arch = GPT,
) -> Block:
    """Self-attention (kv_seq None; causal for a decoder, not for a BERT-style encoder) or cross-attention over
    kv_seq encoder positions, with its norm; its core run by `attention`, its projections and norm by `arch`."""
    e = p.act_bytes
    kv = arch.groups(a) if kv_seq is None else a
    qkv = (a + 2 * kv) * (h // a)  # output features of the QKV projection
    if kv_seq is None:
        op, shape = "attention", (("h", h), ("heads", a), ("seq", s), *arch_tags(arch, kv, a, attention=True))
    else:
        op, shape = "cross_attention", (("h", h), ("heads", a), ("seq", s), ("kv_seq", kv_seq))
    shape += attention_shape_tag(attention)
    # backward all-reduces the input gradient at f; cross-attention's K/V projection also takes the encoder output
    bwd_bytes = s * h * e if kv_seq is None else (s + kv_seq) * h * e
    bias = int(arch.bias)
    projections = (
        [(qkv * h, True), *([(qkv, True)] if bias else [])]
        if kv_seq is None
        else [(h * h, True), (h, True), (2 * h * h, True), (2 * h, True)]
    )
    norm = [(h, False)] * arch.norm_params
    return Block(
        op=op,
        shape=shape,
        params=qkv * h + h * h + bias * (qkv + h) + arch.norm_params * h if kv_seq is None else 4 * h * (h + 1) + 2 * h,
        replicated_params=(arch.norm_params + bias) * h,  # the norm and the row-parallel output bias stay whole
        tp="shard",
        tp_fwd_allreduce_bytes=float(s * h * e),
        tp_bwd_allreduce_bytes=float(bwd_bytes),
        ops=attention_ops(h, a, s, e, kv_seq, causal, attention, arch),
        # the norm's scale (and bias), the column-parallel QKV (or Q and KV) weight and bias, the row-parallel output
        # weight (split) and bias (added once after g: whole on every rank), as the torch module registers them
        tensors=(*norm, *projections, (h * h, True), *([(h, False)] if bias else [])),
    )


def mlp_ops(h: int, f: int, s: int, e: int, arch: Arch = GPT) -> tuple[Op, ...]:
    """Megatron's MLP block as kernels: layer norm (or RMSNorm), h -> f projection (column-parallel; SwiGLU: gate
    and up fused, h -> 2f), fused bias + GeLU on the split f features (SwiGLU: silu(gate) x up, reading 2f and
    writing f), f -> h projection (row-parallel), bias + dropout + residual (or the residual add alone)."""
    if arch.mlp == "swiglu":
        fc1 = GemmOp("fc1", s, 2 * f, h, "n", e)
        act = MemoryOp("swiglu", float(3 * s * f * e), tp="shard")
    else:
        fc1 = GemmOp("fc1", s, f, h, "n", e)
        act = MemoryOp("bias_gelu" if arch.bias else "gelu", float(2 * s * f * e), tp="shard")
    return (norm_op(s, h, e, arch.norm), fc1, act, GemmOp("fc2", s, h, f, "k", e),
            residual_op(s, h, e, arch.dropout))  # fmt: skip


def mlp_block(h: int, f: int, s: int, p: Precision, arch: Arch = GPT) -> Block:
    e = p.act_bytes
    up = 2 * f if arch.mlp == "swiglu" else f  # fc1's outputs
    bias = int(arch.bias)
    return Block(
        op="mlp",
        shape=(("h", h), ("ffn", f), ("seq", s), *arch_tags(arch, 0, 0, attention=False)),
        params=(up + f) * h + bias * (up + h) + arch.norm_params * h,
        replicated_params=(arch.norm_params + bias) * h,  # the norm and the second projection's bias
        tp="shard",
        tp_fwd_allreduce_bytes=float(s * h * e),
        tp_bwd_allreduce_bytes=float(s * h * e),
        ops=mlp_ops(h, f, s, e, arch),
        # the norm, fc1 (column-parallel) weight and bias, fc2 (row-parallel) weight; fc2's bias is whole
        tensors=(
            *[(h, False)] * arch.norm_params,
            (h * up, True),
            *([(up, True)] if bias else []),
            (f * h, True),
            *([(h, False)] if bias else []),
        ),
    )


def attention_cores(blocks: tuple[Block, ...] | list[Block]) -> tuple[AttentionOp, ...]:
    """The attention core ops the blocks run, in order (none for an MLP, a CNN or a block without ops)."""
    return tuple(op for b in blocks for op in b.ops if isinstance(op, AttentionOp))


def transformer_layer(
    name: str,
    h: int,
    a: int,
    s: int,
    f: int,
    p: Precision,
    inputs: tuple[str, ...] | None = None,
    cross_kv_seq: int | None = None,
    causal: bool = True,
    attention: str = "flash",
    arch: Arch = GPT,
) -> Layer:
    """One transformer layer: attention (+ cross-attention for a decoder) + MLP, Megatron-split, the attention cores
    run by `attention` (:data:`~distsim.core.models.ops.ATTENTION_IMPLS`), the rest by `arch`.

    Activations kept for backward per sequence (Korthikanti et al. 2022, Sec. 4.1 and 4.2.1; 2-byte activations,
    scaled for others): sh(10 + 24/t) + C/t with tensor parallelism t, C what the attention cores keep besides Q, K,
    V and O (:attr:`AttentionOp.saved_bytes`, read from the blocks' ops so that memory follows the kernel the time
    model runs): with stored scores (``unfused``, ``fused_softmax``) C = 5as^2 (softmax 2as^2, its dropout mask as^2,
    the dropout output 2as^2; (2e + 1) as^2 at e-byte activations), Korthikanti's sh(10 + 24/t + 5as/(ht)); with
    flash attention C = 4as, the fp32 log-sum-exp per query row and head. The 10sh every tp rank keeps (layer-norm
    inputs 4sh, the QKV and fc1 inputs 4sh, two dropout masks 2sh) is what sequence parallelism divides by t
    (Sec. 4.2.2: ``saved_sp_bytes``); of the 24sh + C split over t, the core C is what selective recomputation drops
    (Sec. 5: ``saved_core_bytes``; under flash only the statistics, as checkpointing the flash call drops nothing
    else). A decoder's cross-attention adds its own: 2sh whole, 11sh + its core C (5as kv stored) split.

    Other architectures count the same tensors at their sizes: Q (2sh), K and V (2s kv_heads d each) and the output
    projection's input (2sh); the MLP's activation input and fc2's input (2sf each; SwiGLU keeps gate and up, 4sf,
    and their product, 2sf); without dropout no masks (8sh whole instead of 10sh). Multi-head attention with a GeLU
    MLP of 4h is Korthikanti's 24sh.
    """
    check_attention_impl(attention, f"layer {name!r}")
    blocks = [attention_block(h, a, s, p, causal=causal, attention=attention, arch=arch)]
    scale = p.act_bytes / 2  # Korthikanti's byte counts assume 2-byte activations
    kv_dims = arch.groups(a) * (h // a)
    attention_kept = (2 * h + 4 * kv_dims + 2 * h) * s * scale
    if arch.experts:  # the router's and the experts' (moe_kept) instead of the dense MLP's
        whole, split = moe_kept(h, f, s, arch)
        saved = ((8 if arch.dropout else 6) * s * h + whole) * scale
        saved_sharded = attention_kept + split * scale
    else:
        mlp_kept = 6 * f if arch.mlp == "swiglu" else 4 * f
        saved = (10 if arch.dropout else 8) * s * h * scale
        saved_sharded = attention_kept + mlp_kept * s * scale
    if cross_kv_seq is not None:
        blocks.append(attention_block(h, a, s, p, kv_seq=cross_kv_seq, attention=attention))
        saved += 2 * s * h * scale
        saved_sharded += 11 * s * h * scale
    blocks.append(moe_block(h, f, s, p, arch) if arch.experts else mlp_block(h, f, s, p, arch))
    if p.gemm_bytes == 1:  # FP8: each GEMM on the FP8 tensor cores after its input's cast
        blocks = [replace(b, ops=fp8_ops(b.ops), fwd_flops=0.0, io_bytes=0.0) for b in blocks]
    core = sum(op.saved_bytes for op in attention_cores(blocks))
    return Layer(
        name=name,
        blocks=tuple(blocks),
        out_bytes=float(s * h * p.act_bytes),
        saved_bytes=float(saved),
        saved_sharded_bytes=float(saved_sharded + core),
        saved_core_bytes=float(core),
        saved_sp_bytes=float(saved),
        inputs=inputs,
    )


def _block_with_attention(block: Block, impl: str) -> Block:
    """The block with its attention cores run by `impl` (its shape tag and byte totals following)."""
    if not any(isinstance(op, AttentionOp) for op in block.ops):
        return block
    ops = tuple(op.with_impl(impl) if isinstance(op, AttentionOp) else op for op in block.ops)
    shape = tuple((k, v) for k, v in block.shape if k not in ATTENTION_IMPLS) + attention_shape_tag(impl)
    return replace(block, ops=ops, shape=shape, fwd_flops=0.0, io_bytes=0.0)  # totals refilled from the ops


def with_attention(model: Model, impl: str) -> Model:
    """The model with every attention core run by `impl` (:data:`~distsim.core.models.ops.ATTENTION_IMPLS`): the
    cores' kernels (time), the blocks' event keys, and the layers' kept activations (``saved_sharded_bytes`` and
    ``saved_core_bytes`` exchange the old cores' :attr:`AttentionOp.saved_bytes` for the new ones'). A model without
    attention ops (a CNN, a model file's layers), or already running `impl`, is returned unchanged; the name stays
    (a profile's flash events do not match the new keys). ``with_attention(with_attention(m, x), y)`` is
    ``with_attention(m, y)``."""
    check_attention_impl(impl, f"model {model.name}")
    layers: list[Layer] = []
    changed = False
    for layer in model.layers:
        old = attention_cores(layer.blocks)
        if all(op.impl == impl for op in old):  # also a layer without attention
            layers.append(layer)
            continue
        blocks = tuple(_block_with_attention(b, impl) for b in layer.blocks)
        before, after = sum(op.saved_bytes for op in old), sum(op.saved_bytes for op in attention_cores(blocks))
        layers.append(
            replace(
                layer,
                blocks=blocks,
                saved_sharded_bytes=layer.saved_sharded_bytes - before + after,
                saved_core_bytes=max(0.0, layer.saved_core_bytes - before + after),
            )
        )
        changed = True
    return model.with_layers(tuple(layers)) if changed else model


def embedding_ops(vocab: int, h: int, s: int, e: int, positions: bool = True, dropout: bool = True) -> tuple[Op, ...]:
    """Megatron's VocabParallelEmbedding as kernels: every tp rank gathers (masked) rows for all s tokens, so the
    gather is replicated; then the position add and the embedding dropout (2 s h FLOPs). Backward scatters the
    gradient rows (PyTorch's embedding_dense_backward: sort, segment sums, scatter) into a dense vocab/tp x h weight
    gradient that is zero-filled and accumulated into the fp32 main gradient every micro-batch: (e + e + 4 + 4) bytes
    per weight, whatever the micro-batch size. Without positions and dropout (Llama) the gather is all."""
    touched = 3 * e + 1 if positions else 2 * e + 1  # gathered (+ position) rows read; sum, 1-byte mask written
    after: tuple[Op, ...] = ()
    if positions or dropout:
        after = (MemoryOp("position_add_dropout", float(s * h * touched), flops=float(2 * s * h)),)
    return (
        MemoryOp("embedding_gather", float(2 * s * h * e), bwd_factor=1.0, bwd_kernels=5),
        MemoryOp(
            "embedding_weight_grad",
            0.0,
            tp="shard",
            kernels=0,
            bwd_kernels=2,
            bwd_fixed_bytes=float(vocab * h * (2 * e + 8)),
        ),
        *after,
    )


def embedding_layer(
    name: str, vocab: int, h: int, s: int, p: Precision, positions: bool = True, dropout: bool = True
) -> Layer:
    """Vocabulary-parallel embedding: params split over tp, one all-reduce of the output in forward.

    It keeps its dropout mask, s bytes per hidden unit, which sequence parallelism splits over t (Korthikanti et al.
    2022, Sec. 4.3: sbhp/t for the p micro-batches of the first stage); full recomputation does not re-run it (Megatron
    checkpoints transformer layers only)."""
    e = p.act_bytes
    mask = float(s * h) if dropout else 0.0
    tags = () if dropout else (("dropout", 0),)
    block = Block(
        op="embedding",
        shape=(("vocab", vocab), ("h", h), ("seq", s), ("positions", int(positions)), *tags),
        params=vocab * h + (s * h if positions else 0),
        replicated_params=s * h if positions else 0,  # learned position embeddings are not vocab-split
        tp="shard",
        tp_fwd_allreduce_bytes=float(s * h * e),
        ops=embedding_ops(vocab, h, s, e, positions, dropout),
        tensors=((vocab * h, True), *([(s * h, False)] if positions else [])),  # word rows split, positions whole
    )
    return Layer(name=name, blocks=(block,), out_bytes=float(s * h * e), saved_bytes=mask,
                 saved_sp_bytes=mask, recomputable=False, inputs=())  # fmt: skip


def lm_head_ops(vocab: int, h: int, s: int, e: int, norm: str = "layernorm") -> tuple[Op, ...]:
    """Final layer norm, the logits GEMM (column-parallel over the vocabulary) and Megatron's vocab-parallel fp32
    cross-entropy (megatron/mpu/cross_entropy.py, on ``output.float()``) on the split vocabulary. Its forward passes
    over the s x vocab/tp logits: element-wise, the cast to fp32 (e read, 4 written), subtract the max (8), exp (8)
    and divide by the sum to keep the softmax for backward (8), 24 + e bytes per logit in 4 kernels; row reductions,
    the max and the sum (4 each), in 2 kernels plus 2 small ones (the target logit, the loss). Backward scales the
    kept softmax by the loss gradient (8) and casts it back (4 + e), 12 + e bytes per logit in 4 kernels."""
    elementwise, reductions = 24 + e, 8
    return (
        norm_op(s, h, e, norm),
        GemmOp("logits", s, vocab, h, "n", e),
        MemoryOp(
            "cross_entropy",
            float(s * vocab * elementwise),
            tp="shard",
            kernels=4,
            bwd_kernels=4,
            bwd_factor=(12 + e) / elementwise,
        ),
        MemoryOp(
            "cross_entropy_max_sum",
            float(s * vocab * reductions),
            tp="shard",
            reduction=True,
            kernels=4,
            bwd_kernels=0,
            bwd_factor=0.0,
        ),
    )


def lm_head_layer(
    name: str,
    vocab: int,
    h: int,
    s: int,
    p: Precision,
    inputs: tuple[str, ...] | None = None,
    tied_to: str | None = "embedding",
    norm: str = "layernorm",
) -> Layer:
    """Final layernorm + output projection to the vocabulary + cross-entropy (vocab-parallel, Megatron).

    The projection is column-parallel: backward all-reduces the input gradient (s h elements); the vocab-parallel
    cross-entropy all-reduces three fp32 values per token in forward. Its projection is tied to the word embedding
    (``tied_params``: the final LayerNorm is its own, with gradients of its own, as in the torch module), unless
    `tied_to` is None (untied: the projection is its own, Llama's output layer); the fp32
    softmax of the logits is kept for backward. The final layer norm's input (2sh) divides by t with sequence
    parallelism (Korthikanti et al. 2022, Sec. 4.3); full recomputation does not re-run the head (Megatron checkpoints
    transformer layers only).
    """
    e = p.act_bytes
    norm_params = 2 if norm == "layernorm" else 1
    block = Block(
        op="lm_head",
        shape=(("vocab", vocab), ("h", h), ("seq", s), *((("rmsnorm", 1),) if norm == "rmsnorm" else ())),
        params=vocab * h + norm_params * h,
        replicated_params=norm_params * h,  # the final norm
        tp="shard",
        ops=lm_head_ops(vocab, h, s, e, norm),
        tp_fwd_allreduce_bytes=float(3 * s * 4),
        tp_bwd_allreduce_bytes=float(s * h * e),
        tensors=(*[(h, False)] * norm_params, (vocab * h, True)),  # the final norm (whole), the projection (split)
    )
    return Layer(
        name=name,
        blocks=(block,),
        out_bytes=float(s * 4),
        saved_bytes=float(s * h * e),
        saved_sharded_bytes=float(4 * s * vocab),
        saved_sp_bytes=float(s * h * e),
        recomputable=False,
        inputs=inputs,
        tied_to=tied_to,
        tied_params=vocab * h if tied_to is not None else None,
    )


def _impl_note(attention: str) -> str:
    """What a model's description adds for a non-default attention kernel."""
    return "" if attention == "flash" else f", {attention} attention"


def _tp_constraints(heads: int, h: int, f: int, vocab: int, kv: int | None = None) -> tuple[tuple[str, int], ...]:
    """Megatron splits heads (and the key/value groups of grouped-query attention), the hidden and FFN dimensions
    and the (padded) vocabulary over tp ranks."""
    groups = (("query groups", kv),) if kv is not None and kv != heads else ()
    return (("attention heads", heads), *groups, ("hidden size", h), ("ffn hidden size", f), ("padded vocab", vocab))


def decoder_only(
    name: str,
    layers: int,
    h: int,
    a: int,
    s: int,
    vocab: int,
    source: str,
    f: int | None = None,
    precision: Precision = FP16_MIXED,
    description: str = "",
    causal: bool = True,
    attention: str = "flash",
    arch: Arch = GPT,
) -> Model:
    """GPT-style (or BERT-style encoder-only, causal=False: bidirectional attention) stack: embedding, N layers,
    LM head; `attention` the kernel of every attention core (flash, unfused, fused_softmax); `arch` the layer's
    architecture (:class:`~distsim.core.models.arch.Arch`: GPT's by default, Llama's ...)."""
    check_dims({"layers": layers, "hidden": h, "heads": a, "seq": s, "vocab": vocab, "ffn": f}, f"model {name}")
    check_attention_impl(attention, f"model {name}")
    try:
        kv = arch.groups(a)
    except ModelFileError as exc:
        raise ModelFileError(f"model {name}: {exc}") from None
    f = f or 4 * h
    v = pad_vocab(vocab)
    rope = arch.position == "rope"
    body = [embedding_layer("embedding", v, h, s, precision, positions=not rope, dropout=arch.dropout)]
    dense = replace(arch, experts=0)  # DeepSeek-MoE's first layers: a dense MLP of ffn f
    body += [transformer_layer(f"layer{i}", h, a, s, f, precision, causal=causal, attention=attention,
                               arch=dense if i < arch.first_dense else arch) for i in range(layers)]  # fmt: skip
    body.append(lm_head_layer("lm_head", v, h, s, precision, tied_to="embedding" if arch.tied_embeddings else None,
                              norm=arch.norm))  # fmt: skip
    shape = f"{layers} layers, h={h}, heads={a}, seq={s}, vocab={vocab}" + (f", ffn={f}" if f != 4 * h else "")
    more = arch.describe()
    return Model(
        name=name,
        layers=tuple(body),
        seq_len=s,
        tp_constraints=_tp_constraints(a, h, f, v, kv),
        precision=precision,
        pipeline_layers=layers,
        source=source,
        description=description or shape + (f", {more}" if more else "") + _impl_note(attention),
    )


def encoder_decoder(
    name: str,
    enc_layers: int,
    dec_layers: int,
    h: int,
    a: int,
    f: int,
    enc_seq: int,
    dec_seq: int,
    vocab: int,
    source: str,
    precision: Precision = FP16_MIXED,
    attention: str = "flash",
) -> Model:
    """T5-style model: the encoder output feeds every decoder layer's cross-attention (a DAG, not a chain);
    `attention` the kernel of every attention core."""
    check_dims({"layers": enc_layers, "hidden": h, "heads": a, "ffn": f, "seq": enc_seq, "dec_seq": dec_seq,
                "vocab": vocab}, f"model {name} (encoder)")  # fmt: skip
    check_dims({"layers": dec_layers}, f"model {name} (decoder)")
    check_attention_impl(attention, f"model {name}")
    if enc_layers + dec_layers > MAX_LAYERS:
        raise ModelFileError(
            f"model {name}: {enc_layers:,} + {dec_layers:,} layers is above the limit of {MAX_LAYERS:,}"
        )
    v = pad_vocab(vocab)
    body = [embedding_layer("enc_embedding", v, h, enc_seq, precision, positions=False)]
    body += [transformer_layer(f"enc{i}", h, a, enc_seq, f, precision, causal=False, attention=attention)
             for i in range(enc_layers)]  # fmt: skip
    enc_out = body[-1].name
    dec_emb = embedding_layer("dec_embedding", v, h, dec_seq, precision, positions=False)
    body.append(replace(dec_emb, tied_to="enc_embedding"))
    prev = "dec_embedding"
    for i in range(dec_layers):
        layer = transformer_layer(f"dec{i}", h, a, dec_seq, f, precision, inputs=(prev, enc_out), cross_kv_seq=enc_seq,
                                  attention=attention)  # fmt: skip
        body.append(layer)
        prev = layer.name
    body.append(lm_head_layer("lm_head", v, h, dec_seq, precision, inputs=(prev,), tied_to="enc_embedding"))
    return Model(
        name=name,
        layers=tuple(body),
        seq_len=enc_seq,
        tp_constraints=_tp_constraints(a, h, f, v),
        precision=precision,
        source=source,
        description=(
            f"{enc_layers}+{dec_layers} layers, h={h}, heads={a}, ffn={f}, enc seq={enc_seq}, dec seq={dec_seq}"
            f"{_impl_note(attention)}"
        ),
    )
