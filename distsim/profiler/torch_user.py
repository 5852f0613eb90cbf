"""The user's code behind ``distsim profile --torch-model module:function``: loading it, calling it, its loss.

The contract: ``function()`` takes no arguments and returns ``(module, batch)``, an ``nn.Module`` and one example
micro-batch, which the module takes as ``module(**batch)`` (a mapping), ``module(*batch)`` (a tuple or list) or
``module(batch)`` (a tensor). Both are moved to the profiling device and the module is put in training mode; its
parameters' dtype sets the precision (float32: ``fp32``, bfloat16 or float16: ``fp16-mixed``). The training loss is
the output's ``.loss`` (a Hugging Face model given ``labels``), else the output itself when it is a one-element
tensor, else the sum of the output's floating-point tensors. The micro-batch size is the leading dimension of the
batch's first tensor; a batch whose first tensor is a 2-D integer tensor (token ids) gives the sequence length.
``module`` is a module path imported as ``python -c "import module"`` would from the current directory, or a file
``path/to/file.py``.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from distsim.core.errors import DistsimError


class TorchModelError(DistsimError):
    """A ``--torch-model`` that cannot be imported, called or traced as the contract says."""


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def load_factory(spec: str) -> Callable[[], Any]:
    """The function that `spec` (``module:function`` or ``path/to/file.py:function``) names."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise TorchModelError(f"--torch-model must be module:function or path/to/file.py:function, got {spec!r}")
    try:
        if where.endswith(".py") or os.sep in where:
            path = Path(where)
            if not path.is_file():
                raise TorchModelError(f"--torch-model {spec}: no such file {where}")
            folder = str(path.resolve().parent)  # as running the script would: its siblings import
            if folder not in sys.path:
                sys.path.insert(0, folder)
            loader = importlib.util.spec_from_file_location(f"distsim_user_{path.stem}", path)
            if loader is None or loader.loader is None:
                raise TorchModelError(f"--torch-model {spec}: cannot import {where}")
            mod = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(mod)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:  # the console script lacks it; python -m has it
                sys.path.insert(0, os.getcwd())
            mod = importlib.import_module(where)
    except TorchModelError:
        raise
    except (Exception, SystemExit) as exc:  # the user's module failed to import (or exited): one line, no traceback
        raise TorchModelError(f"--torch-model {spec}: cannot import {where} ({first_line(exc)})") from None
    fn = getattr(mod, name, None)
    if fn is None:
        raise TorchModelError(f"--torch-model {spec}: {where} has no {name!r}")
    if not callable(fn):
        kind = type(fn).__name__
        raise TorchModelError(f"--torch-model {spec}: {name!r} is not callable (a{'n' * (kind[0] in 'aeiou')} {kind})")
    return fn


def build(spec: str, device: torch.device) -> tuple[nn.Module, Any]:
    """Call the user's function; check and move what it returns (the module in training mode)."""
    fn = load_factory(spec)
    try:
        made = fn()
    except (Exception, SystemExit) as exc:  # sys.exit() in the user's function too; Ctrl-C still aborts
        raise TorchModelError(f"--torch-model {spec}: calling it raised {first_line(exc)}") from None
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module)):
        got = type(made).__name__ if not isinstance(made, tuple) else f"a tuple of {len(made)}"
        raise TorchModelError(f"--torch-model {spec} must return (nn.Module, example batch), got {got}")
    module, batch = made
    if not isinstance(batch, (Mapping, tuple, list, Tensor)) or not tensors_in(batch):
        raise TorchModelError(f"--torch-model {spec}: the example batch must be a mapping, tuple, list or tensor "
                              f"holding tensors, got {type(batch).__name__}")  # fmt: skip
    if not any(p.requires_grad for p in module.parameters()):
        raise TorchModelError(f"--torch-model {spec}: the module has no trainable parameters")
    module = module.to(device).train()
    batch = dict(batch) if isinstance(batch, Mapping) else batch  # e.g. a tokenizer's BatchEncoding
    return module, map_tensors(lambda t: t.to(device), batch)


def call_module(module: nn.Module, batch: Any) -> Any:
    if isinstance(batch, Mapping):
        return module(**batch)
    if isinstance(batch, (tuple, list)):
        return module(*batch)
    return module(batch)


def loss_of(output: Any) -> Tensor:
    """The loss to train on: ``output.loss``, a one-element output, else the sum of its floating-point tensors."""
    loss = getattr(output, "loss", None)
    if isinstance(loss, Tensor):
        return loss
    if isinstance(output, Tensor) and output.numel() == 1:
        return output.reshape(())
    floats = [t for t in tensors_in(output) if t.is_floating_point() and t.requires_grad]
    if not floats:
        raise TorchModelError("the module's output holds no floating-point tensor that needs a gradient to train on")
    return torch.stack([t.float().sum() for t in floats]).sum()


def tensors_in(obj: Any) -> list[Tensor]:
    """The tensors in nested tuples, lists and mappings (a Hugging Face ModelOutput is a mapping), in order."""
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, Mapping):
        return [t for v in obj.values() for t in tensors_in(v)]
    if isinstance(obj, (tuple, list)):
        return [t for v in obj for t in tensors_in(v)]
    return []


def map_tensors(fn: Callable[[Tensor], Any], obj: Any) -> Any:
    """`obj` with every tensor in nested tuples, lists and dicts replaced by fn(tensor); other objects kept."""
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return type(obj)({k: map_tensors(fn, v) for k, v in obj.items()}) if type(obj) is dict else obj
    if isinstance(obj, (tuple, list)) and type(obj) in (tuple, list):
        return type(obj)(map_tensors(fn, v) for v in obj)
    return obj


def _is_plain(obj: Any) -> bool:
    return obj is None or isinstance(obj, (Tensor, bool, int, float, str, torch.dtype, torch.device))


def snapshot(obj: Any) -> Any:
    """A copy of a call's arguments to call again later: tensors by reference, other objects (a key-value cache
    the call would append to) deep-copied as they are now, their tensors detached (see :func:`_detaching_copies`),
    or kept as they are when they cannot be copied."""
    if isinstance(obj, (tuple, list)) and type(obj) in (tuple, list):
        return type(obj)(snapshot(v) for v in obj)
    if type(obj) is dict:
        return {k: snapshot(v) for k, v in obj.items()}
    if _is_plain(obj):
        return obj
    try:
        with _detaching_copies():
            return copy.deepcopy(obj)
    except Exception:
        return obj


@contextlib.contextmanager
def _detaching_copies() -> Iterator[None]:
    """While active, deep-copying a tensor that autograd computed gives a detached copy (torch refuses to copy
    one: a cache's keys and values are such tensors). The copy's state is the data a call would see; the gradients
    into earlier layers through it are theirs, not the called block's."""
    original = Tensor.__deepcopy__

    def deepcopy(self: Tensor, memo: dict[int, Any]) -> Tensor:
        if self.grad_fn is None:
            return original(self, memo)
        out = memo[id(self)] = self.detach().clone()
        return out

    Tensor.__deepcopy__ = deepcopy  # type: ignore[method-assign]
    try:
        yield
    finally:
        Tensor.__deepcopy__ = original  # type: ignore[method-assign]


def batch_size(batch: Any) -> int:
    first = tensors_in(batch)[0]
    return int(first.shape[0]) if first.ndim else 1


def seq_len(batch: Any) -> int | None:
    first = tensors_in(batch)[0]
    integer = not first.is_floating_point() and not first.is_complex() and first.dtype != torch.bool
    return int(first.shape[1]) if first.ndim == 2 and integer else None


def precision_of(module: nn.Module) -> str:
    dtypes = {p.dtype for p in module.parameters() if p.is_floating_point()}
    return "fp16-mixed" if dtypes & {torch.bfloat16, torch.float16} else "fp32"
