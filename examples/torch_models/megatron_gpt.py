"""A megatron-core ``GPTModel`` (world size 1, local layer spec) for ``distsim profile --torch-model``.

Builders (each returns the model on this machine's device in training mode and a fixed micro-batch):
  gpt2_medium             GPT-2 medium's shape: 24 layers of 1024, 16 heads, seq 1024, micro-batch 8 (GPU)
  gpt3_1_3b               GPT-3 1.3B's shape (as distsim's zoo has it): 24 layers of 2048, 16 heads, seq 2048,
                          micro-batch 2 (GPU)
  toy                     2 layers of 64, 4 heads, seq 32, vocabulary 256, micro-batch 2 (CPU tests)
  *_recompute             each with Megatron's full recomputation (recompute_granularity="full",
                          recompute_method="uniform", recompute_num_layers=1: every layer keeps only its input)
The GPU shapes use GPT-2's vocabulary padded as Megatron-LM pads it (50257 -> 50304, a multiple of 128), learned
absolute positions and the LM head tied to the word embedding, as Megatron-LM's GPT pretraining does.

The model is ``get_gpt_layer_local_spec()`` (megatron-core's own modules, no Transformer Engine or Apex) with one
change: the core attention is PyTorch's ``scaled_dot_product_attention`` (causal), because megatron-core's local
``DotProductAttention`` allocates its score buffer with ``torch.cuda.current_device()`` and so cannot run on a CPU,
and on a GPU it is the unfused softmax no one trains with. ``DISTSIM_EXAMPLE_MEGATRON_ATTENTION=local`` keeps
megatron-core's own attention (CUDA only).

Megatron needs torch.distributed and its model-parallel groups: the builder initialises them (gloo on the CPU, NCCL
on CUDA; ``MASTER_ADDR``/``MASTER_PORT`` set to this host and a free port when missing; world size 1 unless
``WORLD_SIZE`` says otherwise) only when nothing has, and seeds megatron's CUDA RNG tracker on CUDA. The module
distsim gets is :class:`GPTLoss`, which calls the ``GPTModel`` with the batch's token ids, positions, attention mask
and labels and returns the mean per-token loss; the repeated blocks distsim finds are still the model's decoder
layers (``gpt.decoder.layers.0 .. N-1``, ``TransformerLayer``). Precision: see ``example_setup.py``.
"""

from __future__ import annotations

import os
import socket
import warnings

import torch
from example_setup import SEED, device, dtype, token_ids
from torch import nn

ATTENTION_ENV = "DISTSIM_EXAMPLE_MEGATRON_ATTENTION"


class GPTLoss(nn.Module):
    """A ``GPTModel`` whose forward returns the training loss (the mean of the per-token losses it returns given
    labels), so that the module alone is what distsim profiles and the plain loop trains."""

    def __init__(self, gpt: nn.Module) -> None:
        super().__init__()
        self.gpt = gpt

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor,
                labels: torch.Tensor) -> torch.Tensor:  # fmt: skip
        return self.gpt(input_ids, position_ids, attention_mask, labels=labels).mean()


def init_parallel(dev: torch.device) -> None:
    """torch.distributed and megatron's model-parallel groups (tensor and pipeline parallel 1), each only if nothing
    has initialised it yet (a launcher or the caller's own training script may have)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            with socket.socket() as s:  # a free port now; another process could take it first (rarely)
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=world)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)


def allow_cpu_recompute() -> None:
    """megatron-core's full recomputation (``tensor_parallel.checkpoint``) saves the CUDA RNG state with the
    layer's input and restores it before recomputing, which fails without CUDA. With no CUDA there is no such state
    (the CPU generator's state is saved as well, and is enough), so on the CPU only, those two calls become no-ops:
    the toy recompute model then runs, and is tested, here. On CUDA nothing is changed."""
    if torch.cuda.is_available():
        return
    from megatron.core.tensor_parallel import random as mrandom

    for name in ("_get_cuda_rng_state", "_set_cuda_rng_state"):
        if not hasattr(mrandom, name):
            raise RuntimeError(f"this megatron-core has no tensor_parallel.random.{name}: its full recomputation "
                               "cannot be made to run on the CPU (it does on CUDA)")  # fmt: skip
        setattr(mrandom, name, lambda *args, **kwargs: None)


def sdpa_attention_class() -> type[nn.Module]:
    """megatron-core's ``DotProductAttention`` with its forward replaced by PyTorch's fused causal attention (GQA
    included). Made on first use so that importing this file does not need megatron-core."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class SDPAAttention(DotProductAttention):
        def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor,
                    attn_mask_type: object = None, attention_bias: object = None,
                    packed_seq_params: object = None) -> torch.Tensor:  # fmt: skip
            """[s, b, heads, d] in, [s, b, heads * d] out, as megatron's core attention; the mask is the causal
            one the layer spec declares, which ``is_causal`` applies without materialising it."""
            if packed_seq_params is not None or attention_bias is not None:
                raise NotImplementedError("SDPAAttention: packed sequences and attention bias are not supported")
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
            p = self.attention_dropout.p if self.training else 0.0
            out = nn.functional.scaled_dot_product_attention(
                q, k, v, dropout_p=p, is_causal=True, scale=self.softmax_scale, enable_gqa=k.shape[1] != q.shape[1]
            )
            return out.permute(2, 0, 1, 3).reshape(out.shape[2], out.shape[0], -1)

    return SDPAAttention


def layer_spec() -> object:
    """``get_gpt_layer_local_spec()`` with SDPA as its core attention (unless the environment asks for megatron's
    own, which needs CUDA)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec()
    attention = os.environ.get(ATTENTION_ENV, "sdpa").strip().lower()
    if attention not in ("sdpa", "local"):
        raise ValueError(f"{ATTENTION_ENV}={attention!r}: expected sdpa or local")
    if attention == "sdpa":
        spec.submodules.self_attention.submodules.core_attention = sdpa_attention_class()
    return spec


def quiet_megatron() -> None:
    """Silence megatron-core's import-time notes that Transformer Engine and Apex are missing: this example uses
    neither on purpose (megatron's own modules), so the notes would only bury distsim's output."""
    for message in ("Transformer Engine and Apex are not installed", "Apex is not installed"):
        warnings.filterwarnings("ignore", message=message, category=UserWarning)


def build(layers: int, hidden: int, heads: int, seq: int, vocab: int, batch: int, recompute: bool = False) -> tuple[
    nn.Module, dict[str, torch.Tensor]
]:  # fmt: skip
    """A seeded GPTModel of this shape on the device, wrapped in :class:`GPTLoss`, and its micro-batch."""
    quiet_megatron()
    from megatron.core.models.gpt import GPTModel
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    dev = device()
    init_parallel(dev)
    torch.manual_seed(SEED)
    if dev.type == "cuda":  # megatron initialises weights on the GPU under its RNG tracker, which needs a seed
        model_parallel_cuda_manual_seed(SEED)
    precision = dtype(dev)
    full = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    if recompute:
        allow_cpu_recompute()
    config = TransformerConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                               use_cpu_initialization=dev.type == "cpu", params_dtype=precision,
                               bf16=precision == torch.bfloat16, fp16=precision == torch.float16,
                               **(full if recompute else {}))  # fmt: skip
    gpt = GPTModel(config, layer_spec(), vocab_size=vocab, max_sequence_length=seq,
                   share_embeddings_and_output_weights=True)  # fmt: skip
    # megatron makes its layer norms in fp32 whatever params_dtype says; its Float16Module casts the whole model
    model = GPTLoss(gpt).to(device=dev, dtype=precision).train()
    ids = token_ids(batch, seq, vocab, dev)
    positions = torch.arange(seq, device=dev).expand(batch, seq)
    causal = torch.ones(1, 1, seq, seq, dtype=torch.bool, device=dev).triu(1)  # True: masked (Megatron's convention)
    return model, {"input_ids": ids, "position_ids": positions, "attention_mask": causal, "labels": ids}


def gpt2_medium() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return build(24, 1024, 16, 1024, 50304, 8)


def gpt2_medium_recompute() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return build(24, 1024, 16, 1024, 50304, 8, recompute=True)


def gpt3_1_3b() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return build(24, 2048, 16, 2048, 50304, 2)


def gpt3_1_3b_recompute() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return build(24, 2048, 16, 2048, 50304, 2, recompute=True)


def toy() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return build(2, 64, 4, 32, 256, 2)


def toy_recompute() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return build(2, 64, 4, 32, 256, 2, recompute=True)
