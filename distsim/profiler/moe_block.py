"""The torch module of a mixture-of-experts MLP block (:func:`distsim.core.models.moe.moe_block`, op ``moe``), with
every expert on every rank (expert parallelism 1), split over tp as a dense MLP is.

``x + g(sum_k w_k · W2_e(k) · act(W1_e(k) · f(norm(x))) [+ W2_s · act(W1_s · f(norm(x)))]) [+ sum_k w_k b2_e(k)]``
for the top_k experts e(k) of each token and their weights w_k: a pre-norm (LayerNorm, or RMSNorm when the shape is
tagged ``rmsnorm``); a router ``Linear(h, experts, bias=False)`` whole on every tp rank; its softmax in fp32 and
``torch.topk`` of ``top_k`` experts per token, whose probabilities are renormalised to sum to 1 (Mixtral's, Jiang
et al. 2024, Sec. 2.1); the routed copies of the tokens permuted into expert order (one stable sort,
``index_select``), each expert's MLP on its own tokens (SwiGLU with fc1's gate and up rows interleaved as
:mod:`distsim.profiler.llama_blocks` lays them out, or GeLU), the outputs weighted by their probabilities and summed
back per token (``index_add_``); the shared experts' MLP on every token where the shape has ``shared_ffn``; the
residual add. Every expert runs, also on no tokens, so every parameter gets a gradient.

Tensor parallelism as Megatron's dense MLP: each expert's (and the shared experts') fc1 column-parallel after ``f``,
fc2 row-parallel, its partial output summed by one ``g`` for the whole block, the fc2 biases (whole on every rank)
added after it. The router and the routing are replicated: every rank computes the same top-k. The expert outputs
of a rank are partial sums, so the gradient of the routing weights they are multiplied by is partial too; ``f`` on
those weights (identity forward, all-reduce backward, ``tokens x top_k`` values) makes it whole, and with it the
router's gradient and the router's contribution to the input's. (Megatron all-reduces the router's weight gradient
over tp instead, with the sequence-parallel norms' gradients.)

Parameters are registered in ``Block.tensors``' order: the norm's, ``router.weight``, then per expert
``experts.<i>.fc1.weight`` [``.fc1.bias``], ``experts.<i>.fc2.weight`` [``.fc2.bias``], then ``shared.fc1.weight``
and ``shared.fc2.weight`` (the shared experts have no biases, as the block counts them).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import skip_init

from distsim.core.models.graph import Block
from distsim.profiler.blocks import BlockModule, _check_params, _dims, _divisible
from distsim.profiler.llama_blocks import _flag, make_norm, norm_params
from distsim.profiler.tp_comm import TPComm


class ExpertMLP(nn.Module):
    """One expert's MLP shard: fc1 (column-parallel; SwiGLU: gate and up rows interleaved) and fc2 (row-parallel),
    without the collective after fc2 and without fc2's bias (the block adds both once)."""

    def __init__(self, h: int, ffn: int, tp: int, swiglu: bool, bias: bool, kw: dict[str, Any]) -> None:
        super().__init__()
        self.swiglu = swiglu
        up = 2 * ffn if swiglu else ffn
        self.fc1 = skip_init(nn.Linear, h, up // tp, bias=bias, **kw)
        self.fc2 = skip_init(nn.Linear, ffn // tp, h, bias=bias, **kw)

    def forward(self, x: Tensor) -> Tensor:
        y = self.fc1(x)
        if self.swiglu:
            gate, up = y.unflatten(-1, (-1, 2)).unbind(-1)
            y = F.silu(gate) * up
        else:
            y = F.gelu(y)
        return F.linear(y, self.fc2.weight)


class MoEModule(BlockModule):
    """A mixture-of-experts MLP block with the residual, expert parallelism 1 (the module docstring)."""

    def __init__(
        self, block: Block, tp: int, tp_rank: int, comm: TPComm, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__(block, tp, tp_rank, comm, dtype, device)
        d = _dims(block, ("h", "ffn", "seq", "experts", "top_k"))
        h, ffn, experts, top_k = d["h"], d["ffn"], d["experts"], d["top_k"]
        shared = int(dict(block.shape).get("shared_ffn", 0))
        if not 1 <= top_k <= experts:
            raise ValueError(f"cannot build a 'moe' block: top_k={top_k} of {experts} experts")
        _divisible(block, "ffn", ffn, tp)
        if shared:
            _divisible(block, "shared_ffn", shared, tp)
        self.swiglu = _flag(block, "swiglu", 0)
        bias = _flag(block, "bias", 1)
        up = 2 if self.swiglu else 1
        expert_params = up * ffn * h + bias * up * ffn + ffn * h + bias * h
        _check_params(block, norm_params(block) * h + h * experts + experts * expert_params + up * shared * h
                      + shared * h)  # fmt: skip
        self.h, self.seq, self.num_experts, self.top_k = h, d["seq"], experts, top_k
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.ln = make_norm(block, h, kw)
        self.router = skip_init(nn.Linear, h, experts, bias=False, **kw)
        self.experts = nn.ModuleList(ExpertMLP(h, ffn, tp, self.swiglu, bias, kw) for _ in range(experts))
        for i in range(experts):
            self.tp_split.update({f"experts.{i}.fc1.weight": 0, f"experts.{i}.fc2.weight": 1}
                                 | ({f"experts.{i}.fc1.bias": 0} if bias else {}))  # fmt: skip
        self.shared = ExpertMLP(h, shared, tp, self.swiglu, False, kw) if shared else None
        if shared:
            self.tp_split.update({"shared.fc1.weight": 0, "shared.fc2.weight": 1})

    def route(self, y: Tensor) -> tuple[Tensor, Tensor]:
        """The top_k experts of each of the normed tokens `y` [tokens, h] ([tokens, top_k]) and their probabilities
        renormalised to sum to 1, in fp32 (float64 for a float64 module)."""
        logits = self.router(y)
        probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)  # float64 stays
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        return chosen, weights / weights.sum(dim=-1, keepdim=True)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        y = self.ln(x).reshape(-1, self.h)  # the router reads the normed tokens whole, outside f
        chosen, weights = self.route(y)
        weights = weights.to(x.dtype)
        local = self.comm.f(y)
        # permute: the routed copies (token t's k-th choice is copy t * top_k + k) in expert order
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tokens = order // self.top_k
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        copies = local.index_select(0, tokens).split(counts)
        routed = torch.cat([expert(part) for expert, part in zip(self.experts, copies, strict=True)])
        # unpermute: weighted by the (tp-whole in backward) routing weights, summed per token
        w = self.comm.f(weights).reshape(-1).index_select(0, order)
        out = torch.zeros_like(y).index_add_(0, tokens, routed * w.unsqueeze(-1))
        if self.shared is not None:
            out = out + self.shared(local)
        result = x + self.comm.g(out).reshape(shape)
        biases = [e.fc2.bias for e in self.experts if e.fc2.bias is not None]
        if biases:  # whole on every rank, after g: sum_k w_k b2_e(k)
            b2 = torch.stack(biases)
            result = result + (weights.unsqueeze(-1) * b2[chosen]).sum(dim=1).reshape(shape)
        return result

    def example_inputs(self, micro_batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        return (self._randn((micro_batch_size, self.seq, self.h), self._gen(generator)),)
