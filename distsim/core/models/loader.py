"""User model descriptions (the parsed content of a YAML or JSON file) -> Model.

Two forms, which may be combined (the transformer stack first, then the listed layers)::

    name: tiny-gpt
    transformer: {layers: 4, hidden: 512, heads: 8, seq: 256, vocab: 32000}   # embedding + layers + LM head
                                     # optional: ffn, attention (flash | unfused | fused_softmax; default flash),
                                     # the architecture (distsim.core.models.arch): kv_heads, mlp (gelu | swiglu),
                                     # norm (layernorm | rmsnorm), position (learned | rope), tied_embeddings,
                                     # bias, dropout (true | false)

    name: what-if
    precision: fp16-mixed            # or fp32
    micro_batch_size: 2              # only this micro-batch size is valid (a profiled torch module's); default: any
    layers:
      - name: block                  # one layer; `repeat: 4` makes block0..block3
        forward_s: 0.010             # given time per micro-batch (backward defaults to 2x forward)
        backward_s: 0.020
        params: 1000000
        out_bytes: 2048              # activation bytes per sample at the output (a pipeline cut carries it)
        saved_bytes: 4096            # bytes per sample kept for backward
        saved_core_bytes: 0          # of saved_sharded_bytes, what selective recomputation drops (attention core)
        saved_sp_bytes: 0            # of saved_bytes, what sequence parallelism divides by tp
        recomputable: true           # full recomputation re-runs it (false: an embedding or LM head; default true)
        repeat: 4
      - name: head
        flops: 1.0e9                 # forward FLOPs per sample (time then comes from the cost source)
        params: 5000
        tp: shard                    # shard | replicate | none (default none)
        tp_allreduce_bytes: 2048     # per sample, after forward and in backward, when tp > 1
        inputs: [block3]             # default: the previous layer
        tied_to: block0              # shares weights with that layer; tied_params: how many (default: all)

Unknown keys are errors, so a misspelt field is named rather than silently ignored.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from distsim.core.checks import integer, number, positive_int
from distsim.core.errors import ModelFileError
from distsim.core.models.arch import ARCH_KEYS, GPT, arch_from_items
from distsim.core.models.graph import MAX_LAYERS, PRECISIONS, Block, Layer, Model
from distsim.core.models.ops import check_attention_impl
from distsim.core.models.transformer import check_dims, decoder_only

_MODEL_KEYS = {
    "name",
    "precision",
    "source",
    "description",
    "seq_len",
    "tp_constraints",
    "pipeline_layers",
    "micro_batch_size",
    "transformer",
    "layers",
}
_TRANSFORMER_KEYS = {"layers", "hidden", "heads", "seq", "vocab", "ffn", "attention", *ARCH_KEYS}
_BLOCK_KEYS = {
    "op", "forward_s", "backward_s", "flops", "params", "io_bytes", "tp", "tp_allreduce_bytes",
    "tp_fwd_allreduce_bytes", "tp_bwd_allreduce_bytes", "shape",
}  # fmt: skip
_LAYER_KEYS = _BLOCK_KEYS | {
    "name", "out_bytes", "saved_bytes", "saved_sharded_bytes", "saved_core_bytes", "saved_sp_bytes", "inputs", "repeat",
    "blocks", "tied_to", "tied_params", "recomputable",
}  # fmt: skip


def _check_keys(data: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ModelFileError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")


def _num(data: dict[str, Any], key: str, where: str, default: float = 0.0) -> float:
    return number(data.get(key, default), f"{where}: {key}", ModelFileError)


def _opt_num(data: dict[str, Any], key: str, where: str) -> float | None:
    return None if data.get(key) is None else _num(data, key, where)


def _block(data: dict[str, Any], where: str, default_op: str) -> Block:
    _check_keys(data, _BLOCK_KEYS | ({"name"} if "name" in data else set()), where)
    both = _num(data, "tp_allreduce_bytes", where)
    shape = data.get("shape", {})
    if not isinstance(shape, dict):
        raise ModelFileError(f"{where}: shape must be a mapping of dimension names to integers")
    return Block(
        op=str(data.get("op", default_op)),
        shape=tuple((str(k), integer(v, f"{where}: shape {k}", ModelFileError, minimum=0)) for k, v in shape.items()),
        fwd_flops=_num(data, "flops", where),
        params=int(_num(data, "params", where)),
        io_bytes=_num(data, "io_bytes", where),
        tp=str(data.get("tp", "none")),  # type: ignore[arg-type]
        tp_fwd_allreduce_bytes=_num(data, "tp_fwd_allreduce_bytes", where, both),
        tp_bwd_allreduce_bytes=_num(data, "tp_bwd_allreduce_bytes", where, both),
        fwd_s=_opt_num(data, "forward_s", where),
        bwd_s=_opt_num(data, "backward_s", where),
    )


def _layers(entry: Any, index: int, room: int, file: str) -> list[Layer]:
    """The layers of one entry (`repeat` copies), at most `room` of them (what MAX_LAYERS leaves)."""
    where = f"{file} layers[{index}]"
    if not isinstance(entry, dict):
        raise ModelFileError(f"{where}: each layer must be a mapping, got {type(entry).__name__}")
    _check_keys(entry, _LAYER_KEYS, where)
    name = str(entry.get("name", f"layer{index}"))
    where = f"{file} layer {name!r}"
    if "blocks" in entry:
        blocks_data = entry["blocks"]
        if not isinstance(blocks_data, list) or not blocks_data:
            raise ModelFileError(f"{where}: blocks must be a non-empty list")
        own = {k: v for k, v in entry.items() if k in _BLOCK_KEYS}
        if own:
            raise ModelFileError(f"{where}: give {sorted(own)[0]!r} inside blocks, not next to them")
        blocks = tuple(_block(b, f"{where} block {i}", "custom") for i, b in enumerate(blocks_data))
    else:
        block_data = {k: v for k, v in entry.items() if k in _BLOCK_KEYS}
        default_op = "custom" if ("forward_s" in entry or "backward_s" in entry) else "layer"
        blocks = (_block(block_data, where, default_op),)
        if default_op == "custom" and "op" not in entry:  # distinct given-time layers must not share a key
            blocks = (replace(blocks[0], op=f"custom:{name}"),)
    inputs = entry.get("inputs")
    if inputs is not None and not isinstance(inputs, list):
        raise ModelFileError(f"{where}: inputs must be a list of layer names")
    repeat = positive_int(entry.get("repeat", 1), f"{where}: repeat", ModelFileError, MAX_LAYERS)
    if repeat > room:
        raise ModelFileError(f"{where}: repeat {repeat:,} takes the model past the limit of {MAX_LAYERS:,} layers")
    recomputable = entry.get("recomputable", True)
    if not isinstance(recomputable, bool):
        raise ModelFileError(f"{where}: recomputable must be true or false, got {recomputable!r}")
    tied = entry.get("tied_params")
    tied_params = None if tied is None else integer(tied, f"{where}: tied_params", ModelFileError, minimum=0)
    out = []
    for k in range(repeat):
        layer_inputs = tuple(map(str, inputs)) if inputs is not None and k == 0 else None
        out.append(
            Layer(
                name=name if repeat == 1 else f"{name}{k}",
                blocks=blocks,
                out_bytes=_num(entry, "out_bytes", where),
                saved_bytes=_num(entry, "saved_bytes", where),
                saved_sharded_bytes=_num(entry, "saved_sharded_bytes", where),
                saved_core_bytes=_num(entry, "saved_core_bytes", where),
                saved_sp_bytes=_num(entry, "saved_sp_bytes", where),
                inputs=layer_inputs,
                tied_to=None if entry.get("tied_to") is None else str(entry["tied_to"]),
                tied_params=tied_params,
                recomputable=recomputable,
            )
        )
    return out


def model_from_dict(data: Any, where: str = "model file") -> Model:
    if not isinstance(data, dict):
        raise ModelFileError(f"{where}: expected a mapping at the top level")
    _check_keys(data, _MODEL_KEYS, where)
    if "transformer" not in data and "layers" not in data:
        raise ModelFileError(f"{where}: needs 'layers' (a list) or 'transformer' (a stack description)")
    precision_name = str(data.get("precision", "fp16-mixed"))
    if precision_name not in PRECISIONS:
        raise ModelFileError(f"{where}: precision must be one of {', '.join(PRECISIONS)}, got {precision_name!r}")
    precision = PRECISIONS[precision_name]
    name = str(data.get("name", "custom"))
    layers: list[Layer] = []
    constraints: list[tuple[str, int]] = []
    pipeline_layers: int | None = None
    seq_len = data.get("seq_len")
    if "transformer" in data:
        t = data["transformer"]
        if not isinstance(t, dict):
            raise ModelFileError(f"{where}: transformer must be a mapping")
        _check_keys(t, _TRANSFORMER_KEYS, f"{where} transformer")
        missing = [k for k in ("layers", "hidden", "heads", "seq", "vocab") if k not in t]
        if missing:
            raise ModelFileError(f"{where}: transformer needs {', '.join(missing)}")
        attention = check_attention_impl(t.get("attention", "flash"), f"{where} transformer")
        arch = arch_from_items(GPT, t, f"{where} transformer")
        d = check_dims({k: v for k, v in t.items() if k != "attention" and k not in ARCH_KEYS}, f"{where} transformer")
        stack = decoder_only(name, d["layers"], d["hidden"], d["heads"], d["seq"], d["vocab"], source="",
                             f=d.get("ffn"), precision=precision, attention=attention, arch=arch)  # fmt: skip
        layers += stack.layers
        constraints += stack.tp_constraints
        pipeline_layers = stack.pipeline_layers
        seq_len = seq_len if seq_len is not None else stack.seq_len
    raw_layers = data.get("layers", [])
    if not isinstance(raw_layers, list):
        raise ModelFileError(f"{where}: layers must be a list")
    for i, entry in enumerate(raw_layers):
        layers += _layers(entry, i, MAX_LAYERS - len(layers), where)
    tc = data.get("tp_constraints", {})
    if not isinstance(tc, dict):
        raise ModelFileError(f"{where}: tp_constraints must map a dimension name to its size")
    constraints += [(str(k), positive_int(v, f"{where}: tp_constraints {k}", ModelFileError)) for k, v in tc.items()]
    if "pipeline_layers" in data:
        raw = data["pipeline_layers"]
        pipeline_layers = None if raw is None else positive_int(raw, f"{where}: pipeline_layers", ModelFileError)
    mbs = data.get("micro_batch_size")
    return Model(
        name=name,
        layers=tuple(layers),
        seq_len=None if seq_len is None else positive_int(seq_len, f"{where}: seq_len", ModelFileError),
        tp_constraints=tuple(constraints),
        precision=precision,
        pipeline_layers=pipeline_layers,
        micro_batch_size=None if mbs is None else positive_int(mbs, f"{where}: micro_batch_size", ModelFileError),
        source=str(data.get("source", where)),
        description=str(data.get("description", f"{len(layers)} layers from {where}")),
    )
