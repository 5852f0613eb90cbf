"""Transformer workloads (BERT, GPT-2/3, T5) with Megatron-style tensor-parallel splits.

Per-sample forward FLOPs of one layer follow Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", Sec. 5.1: 24 s h^2 + 4 s^2 h per layer, i.e. attention 8 s h^2 + 4 s^2 h and MLP
16 s h^2 with f = 4h). Activation memory kept for backward follows Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", Sec. 4.1 and 4.2.1): s b h (10 + 24/t + 5 a s / (h t)) bytes per layer
with 2-byte activations and tensor parallelism t, without sequence parallelism or recomputation.

Megatron's tensor parallelism (Shoeybi et al. 2019, Fig. 3) needs one all-reduce of the block output (s h elements
per sample) after the attention block and after the MLP block in forward, and one each in backward.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from distsim.checks import positive_int
from distsim.errors import ModelFileError
from distsim.models.graph import FP16_MIXED, MAX_LAYERS, Block, Layer, Model, Precision


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


def attention_block(h: int, a: int, s: int, p: Precision, kv_seq: int | None = None) -> Block:
    """Self-attention (kv_seq None) or cross-attention over kv_seq encoder positions, with its layernorm."""
    e = p.act_bytes
    if kv_seq is None:
        flops = 8 * s * h * h + 4 * s * s * h
        io = e * (8 * s * h + 2 * a * s * s)
        op, shape = "attention", (("h", h), ("heads", a), ("seq", s))
    else:
        flops = 4 * s * h * h + 4 * kv_seq * h * h + 4 * s * kv_seq * h
        io = e * (6 * s * h + 2 * kv_seq * h + 2 * a * s * kv_seq)
        op, shape = "cross_attention", (("h", h), ("heads", a), ("seq", s), ("kv_seq", kv_seq))
    # backward all-reduces the input gradient at f; cross-attention's K/V projection also takes the encoder output
    bwd_bytes = s * h * e if kv_seq is None else (s + kv_seq) * h * e
    return Block(
        op=op,
        shape=shape,
        fwd_flops=float(flops),
        params=4 * h * h + 4 * h + 2 * h,
        replicated_params=3 * h,  # LayerNorm (2h) and the row-parallel output bias (h) stay whole on every rank
        io_bytes=float(io),
        tp="shard",
        tp_fwd_allreduce_bytes=float(s * h * e),
        tp_bwd_allreduce_bytes=float(bwd_bytes),
    )


def mlp_block(h: int, f: int, s: int, p: Precision) -> Block:
    e = p.act_bytes
    return Block(
        op="mlp",
        shape=(("h", h), ("ffn", f), ("seq", s)),
        fwd_flops=float(4 * s * h * f),
        params=2 * h * f + f + h + 2 * h,
        replicated_params=3 * h,  # LayerNorm and the second projection's bias
        io_bytes=float(e * (4 * s * h + 4 * s * f)),
        tp="shard",
        tp_fwd_allreduce_bytes=float(s * h * e),
        tp_bwd_allreduce_bytes=float(s * h * e),
    )


def transformer_layer(
    name: str,
    h: int,
    a: int,
    s: int,
    f: int,
    p: Precision,
    inputs: tuple[str, ...] | None = None,
    cross_kv_seq: int | None = None,
) -> Layer:
    """One transformer layer: attention (+ cross-attention for a decoder) + MLP, Megatron-split."""
    blocks = [attention_block(h, a, s, p)]
    scale = p.act_bytes / 2  # Korthikanti's byte counts assume 2-byte activations
    saved, saved_sharded = 10 * s * h * scale, (24 * s * h + 5 * a * s * s) * scale
    if cross_kv_seq is not None:
        blocks.append(attention_block(h, a, s, p, kv_seq=cross_kv_seq))
        saved += 2 * s * h * scale
        saved_sharded += (11 * s * h + 5 * a * s * cross_kv_seq) * scale
    blocks.append(mlp_block(h, f, s, p))
    return Layer(
        name=name,
        blocks=tuple(blocks),
        out_bytes=float(s * h * p.act_bytes),
        saved_bytes=float(saved),
        saved_sharded_bytes=float(saved_sharded),
        inputs=inputs,
    )


def embedding_layer(name: str, vocab: int, h: int, s: int, p: Precision, positions: bool = True) -> Layer:
    """Vocabulary-parallel embedding: params split over tp, one all-reduce of the output in forward."""
    e = p.act_bytes
    block = Block(
        op="embedding",
        shape=(("vocab", vocab), ("h", h), ("seq", s), ("positions", int(positions))),
        fwd_flops=float(2 * s * h),
        params=vocab * h + (s * h if positions else 0),
        replicated_params=s * h if positions else 0,  # learned position embeddings are not vocab-split
        io_bytes=float(3 * s * h * e),
        tp="shard",
        tp_fwd_allreduce_bytes=float(s * h * e),
    )
    return Layer(name=name, blocks=(block,), out_bytes=float(s * h * e), saved_bytes=float(s * h), inputs=())


def lm_head_layer(
    name: str,
    vocab: int,
    h: int,
    s: int,
    p: Precision,
    inputs: tuple[str, ...] | None = None,
    tied_to: str = "embedding",
) -> Layer:
    """Final layernorm + output projection to the vocabulary + cross-entropy (vocab-parallel, Megatron).

    The projection is column-parallel: backward all-reduces the input gradient (s h elements); the vocab-parallel
    cross-entropy all-reduces three fp32 values per token in forward. Its weights are tied to the embedding; the fp32
    softmax of the logits is kept for backward.
    """
    e = p.act_bytes
    block = Block(
        op="lm_head",
        shape=(("vocab", vocab), ("h", h), ("seq", s)),
        fwd_flops=float(2 * s * h * vocab),
        params=vocab * h + 2 * h,
        replicated_params=2 * h,  # the final LayerNorm
        io_bytes=float(e * (2 * s * h) + 4 * s * vocab),
        tp="shard",
        tp_fwd_allreduce_bytes=float(3 * s * 4),
        tp_bwd_allreduce_bytes=float(s * h * e),
    )
    return Layer(
        name=name,
        blocks=(block,),
        out_bytes=float(s * 4),
        saved_bytes=float(s * h * e),
        saved_sharded_bytes=float(4 * s * vocab),
        inputs=inputs,
        tied_to=tied_to,
    )


def _tp_constraints(heads: int, h: int, f: int, vocab: int) -> tuple[tuple[str, int], ...]:
    """Megatron splits heads, the hidden and FFN dimensions and the (padded) vocabulary over tp ranks."""
    return (("attention heads", heads), ("hidden size", h), ("ffn hidden size", f), ("padded vocab", vocab))


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
) -> Model:
    """GPT-style (or BERT-style encoder-only) stack: embedding, N layers, LM head."""
    check_dims({"layers": layers, "hidden": h, "heads": a, "seq": s, "vocab": vocab, "ffn": f}, f"model {name}")
    f = f or 4 * h
    v = pad_vocab(vocab)
    body = [embedding_layer("embedding", v, h, s, precision)]
    body += [transformer_layer(f"layer{i}", h, a, s, f, precision) for i in range(layers)]
    body.append(lm_head_layer("lm_head", v, h, s, precision))
    return Model(
        name=name,
        layers=tuple(body),
        seq_len=s,
        tp_constraints=_tp_constraints(a, h, f, v),
        precision=precision,
        pipeline_layers=layers,
        source=source,
        description=description or f"{layers} layers, h={h}, heads={a}, seq={s}, vocab={vocab}",
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
) -> Model:
    """T5-style model: the encoder output feeds every decoder layer's cross-attention (a DAG, not a chain)."""
    check_dims({"layers": enc_layers, "hidden": h, "heads": a, "ffn": f, "seq": enc_seq, "dec_seq": dec_seq,
                "vocab": vocab}, f"model {name} (encoder)")  # fmt: skip
    check_dims({"layers": dec_layers}, f"model {name} (decoder)")
    if enc_layers + dec_layers > MAX_LAYERS:
        raise ModelFileError(
            f"model {name}: {enc_layers:,} + {dec_layers:,} layers is above the limit of {MAX_LAYERS:,}"
        )
    v = pad_vocab(vocab)
    body = [embedding_layer("enc_embedding", v, h, enc_seq, precision, positions=False)]
    body += [transformer_layer(f"enc{i}", h, a, enc_seq, f, precision) for i in range(enc_layers)]
    enc_out = body[-1].name
    dec_emb = embedding_layer("dec_embedding", v, h, dec_seq, precision, positions=False)
    body.append(replace(dec_emb, tied_to="enc_embedding"))
    prev = "dec_embedding"
    for i in range(dec_layers):
        layer = transformer_layer(f"dec{i}", h, a, dec_seq, f, precision, inputs=(prev, enc_out), cross_kv_seq=enc_seq)
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
        ),
    )
