"""What the example builders share: the device, the precision and a seeded batch of token ids.

The builders (`hf_gpt2.py`, `hf_llama.py`, `megatron_gpt.py`) are loaded by file path (`distsim profile --torch-model
examples/torch_models/hf_gpt2.py:toy`), which puts this folder on ``sys.path``; that is how they import this module.

Device: CUDA when torch sees one, else the CPU (`distsim profile` profiles on the same device). Precision: the
environment variable ``DISTSIM_EXAMPLE_DTYPE`` (``fp32``, ``bf16`` or ``fp16``) when set, else bf16 on CUDA (what
these models train in there) and fp32 on the CPU (CPU kernels for half precision are slow and not what anyone trains
with). The parameters are made in that dtype: distsim reads the precision from the parameters' dtype, and the plain
training loop (`train_loop.py`) trains them as they are, with no autocast, no loss scaler and no fp32 master copy.
"""

from __future__ import annotations

import os

import torch

DTYPE_ENV = "DISTSIM_EXAMPLE_DTYPE"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SEED = 0


def device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def dtype(dev: torch.device) -> torch.dtype:
    """The parameters' dtype: ``DISTSIM_EXAMPLE_DTYPE`` if set, else bf16 on CUDA and fp32 on the CPU."""
    name = os.environ.get(DTYPE_ENV, "").strip().lower()
    if not name:
        return torch.bfloat16 if dev.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"{DTYPE_ENV}={name!r}: expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


def token_ids(batch: int, seq: int, vocab: int, dev: torch.device) -> torch.Tensor:
    """A fixed (seeded) batch of random token ids: the same batch on every call, whatever ran before."""
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(SEED + 1)).to(dev)


def quiet_transformers() -> None:
    """Silence transformers' warnings (a tiny vocabulary's special tokens, checkpointing notes) in CLI output."""
    from transformers.utils import logging

    logging.set_verbosity_error()


def checkpoint_every_layer(model: torch.nn.Module) -> None:
    """Full activation recomputation of a Hugging Face model: each decoder layer keeps only its input and runs its
    forward again before its backward. transformers 5.24 renamed ``gradient_checkpointing_enable`` to
    ``activation_checkpointing_enable`` (the old name warns); non-reentrant checkpointing either way, the default of
    recent releases, stated so that older ones do the same."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
