"""The modules a rank runs: tensor-parallel shards of a deterministically initialised full model.

Every block of the full (tp=1) model is initialised from a generator seeded by (seed, layer, block), so every plan and
the single-process reference train the same model. A rank builds the full modules of its layers, slices its tp shard
(``shard_state_from_full``) and drops the full ones. A tied layer (an LM head tied to the embedding) starts as a copy
of its target's weight; on the same pipeline rank the two share one parameter, on different ranks each keeps a copy
and their gradients are all-reduced before the optimizer step (Megatron-LM's embedding group).
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from distsim.core.models.graph import Model
from distsim.profiler.blocks import BlockModule, shard_state_from_full
from distsim.profiler.build import build_block
from distsim.profiler.tp_comm import TPComm


def seeded(*parts: int) -> torch.Generator:
    """A CPU generator whose seed is a hash of `parts` (stable across processes and runs)."""
    digest = hashlib.sha256(",".join(map(str, parts)).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def vocab_weight(module: BlockModule) -> nn.Parameter:
    """The [vocab, h] matrix an embedding or LM head shares when tied."""
    for name in ("word.weight", "proj.weight"):
        if name in module.tp_split:
            return dict(module.named_parameters())[name]
    raise ValueError(f"block {module.block.op!r} has no vocabulary matrix to tie")


def _set_vocab_weight(module: BlockModule, weight: nn.Parameter) -> None:
    owner = module.word if hasattr(module, "word") else module.proj  # type: ignore[attr-defined]
    owner.weight = weight


def full_block(model: Model, li: int, bi: int, dtype: torch.dtype, device: torch.device, seed: int) -> BlockModule:
    module = build_block(model.layers[li].blocks[bi], 1, 0, None, torch.float32, "cpu", generator=seeded(seed, li, bi))
    tied = model.layers[li].tied_to
    if tied is not None and bi == 0:
        target = build_block(model.layers[model.index[tied]].blocks[0], 1, 0, None, torch.float32, "cpu",
                             generator=seeded(seed, model.index[tied], 0))  # fmt: skip
        with torch.no_grad():
            vocab_weight(module).copy_(vocab_weight(target))
    return module.to(device=device, dtype=dtype)


def build_modules(
    model: Model,
    layers: list[int],
    tp: int,
    tp_rank: int,
    comm: TPComm,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
) -> dict[tuple[int, int], BlockModule]:
    """(layer, block) -> this rank's shard, for `layers`; tied layers on the same rank share their vocabulary matrix."""
    out: dict[tuple[int, int], BlockModule] = {}
    for li in layers:
        for bi, block in enumerate(model.layers[li].blocks):
            full = full_block(model, li, bi, torch.float32, torch.device("cpu"), seed)
            shard = build_block(block, tp, tp_rank, comm, dtype, device)
            state = shard_state_from_full(full, shard.tp, shard.tp_rank)
            shard.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in state.items()})
            out[(li, bi)] = shard
    held = set(layers)
    for li in layers:
        tied = model.layers[li].tied_to
        if tied is not None and model.index[tied] in held:
            _set_vocab_weight(out[(li, 0)], vocab_weight(out[(model.index[tied], 0)]))
    return out


def unique_parameters(modules: list[BlockModule]) -> list[nn.Parameter]:
    """Parameters of the modules, each once (a shared tied matrix appears in two modules)."""
    seen: set[int] = set()
    params = []
    for m in modules:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params
