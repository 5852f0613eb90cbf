"""One forward pass of a user's torch module seen through hooks, and the modules that become its layers.

Every module call is numbered in order with the tensors autograd saves for backward (``saved_tensors_hooks``), so
that later analysis can place each in a layer. The candidate layers are *repeated blocks*: siblings of one class with
the same parameter shapes (GPT-2's ``transformer.h.0 .. h.23``), the group holding the most parameters first (the
shallower on a tie), taken if the pass calls each once, one after another, with no module holding parameters called
between them. Failing that, the children of the module's body (the outermost module with more than one child) when
they pass the same test; failing that, none (the whole module is one layer).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from distsim.profiler.torch_user import TorchModelError, call_module, first_line, loss_of, snapshot


def signature(module: nn.Module) -> tuple[Any, ...]:
    return (type(module).__qualname__, tuple((n, tuple(p.shape), p.dtype) for n, p in module.named_parameters()))


def param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def repeated_groups(root: nn.Module) -> list[list[str]]:
    """Paths of the sibling groups of one class and parameter shapes (at least two, with parameters), the group
    holding the most parameters first, the shallower first on a tie."""
    found: list[tuple[int, int, list[str]]] = []
    for path, parent in root.named_modules():
        groups: dict[tuple[Any, ...], list[str]] = {}
        for name, child in parent.named_children():
            if param_count(child):
                groups.setdefault(signature(child), []).append(f"{path}.{name}" if path else name)
        for paths in groups.values():
            if len(paths) >= 2:
                params = len(paths) * param_count(root.get_submodule(paths[0]))
                found.append((-params, path.count(".") + (path != ""), paths))
    return [paths for _, _, paths in sorted(found, key=lambda x: (x[0], x[1]))]


def body_children(root: nn.Module) -> list[str]:
    """Paths of the children of the outermost module with more than one child (the fallback layers)."""
    path, module = "", root
    while True:
        children = list(module.named_children())
        if len(children) != 1:
            return [f"{path}.{n}" if path else n for n, _ in children]
        name, module = children[0]
        path = f"{path}.{name}" if path else name


@dataclass
class Call:
    """What one traced forward pass saw a module do."""

    enter: int
    """Sequence number of the call (every module call and saved tensor is numbered in order)."""
    exit: int = -1
    calls: int = 1
    args: Any = None
    """A snapshot of the positional arguments (watched modules only)."""
    kwargs: Any = None
    output: Any = None


@dataclass
class Recording:
    """One forward pass and loss of the module, seen through hooks."""

    calls: dict[str, Call] = field(default_factory=dict)
    saved: list[tuple[int, int, int]] = field(default_factory=list)
    """(sequence number, storage address, bytes) of every tensor autograd saved for backward."""
    seq: int = 0
    output: Any = None
    loss: Tensor | None = None

    def tick(self) -> int:
        self.seq += 1
        return self.seq


def record(module: nn.Module, batch: Any, watch: set[str]) -> Recording:
    """Run forward and loss once, recording every module call (arguments and output of the `watch` ones) and the
    tensors saved for backward."""
    rec = Recording()
    handles = []

    def storage(t: Tensor) -> tuple[int, int]:
        try:
            s = t.untyped_storage()
            return s.data_ptr(), s.nbytes()
        except Exception:  # a tensor subclass without storage
            return id(t), t.numel() * t.element_size()

    def pack(t: Tensor) -> Tensor:
        rec.saved.append((rec.tick(), *storage(t)))
        return t

    for path, sub in module.named_modules():

        def pre_hook(mod: nn.Module, args: Any, kwargs: Any, path: str = path) -> None:
            call = rec.calls.get(path)
            if call is not None:
                call.calls += 1
                return
            call = rec.calls[path] = Call(rec.tick())
            if path in watch:
                call.args, call.kwargs = snapshot(args), snapshot(kwargs)

        def post_hook(mod: nn.Module, args: Any, kwargs: Any, output: Any, path: str = path) -> None:
            call = rec.calls[path]
            if call.exit < 0:
                call.exit = rec.tick()
                if path in watch:
                    call.output = output

        handles.append(sub.register_forward_pre_hook(pre_hook, with_kwargs=True))
        handles.append(sub.register_forward_hook(post_hook, with_kwargs=True))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            rec.output = call_module(module, batch)
            rec.loss = loss_of(rec.output)
    except TorchModelError:
        raise
    except (Exception, SystemExit) as exc:  # sys.exit() in the forward too; Ctrl-C still aborts
        raise TorchModelError(f"the module's forward on the example batch raised {first_line(exc)}") from None
    finally:
        for h in handles:
            h.remove()
    return rec


def choose_units(
    module: nn.Module, rec: Recording, groups: list[list[str]], fallback: list[str]
) -> tuple[list[str], bool]:
    """The modules that become layers, in call order, and whether they are repeated blocks."""
    for paths in groups:
        if _runs_in_turn(module, rec, paths):
            return sorted(paths, key=lambda p: rec.calls[p].enter), True
    called = [p for p in fallback if p in rec.calls]
    if len(called) >= 2 and _runs_in_turn(module, rec, called):
        return sorted(called, key=lambda p: rec.calls[p].enter), False
    return [], False


def _runs_in_turn(module: nn.Module, rec: Recording, paths: list[str]) -> bool:
    """Each module called once, one after another, and no module with parameters of its own called between them."""
    calls = [rec.calls.get(p) for p in paths]
    if any(c is None or c.calls != 1 or c.exit < 0 for c in calls):
        return False
    spans = sorted((c.enter, c.exit) for c in calls)  # type: ignore[union-attr]
    if any(a[1] > b[0] for a, b in itertools.pairwise(spans)):
        return False
    first, last = spans[0][0], spans[-1][1]
    for path, call in rec.calls.items():
        between = first < call.enter < last and not any(a <= call.enter <= b for a, b in spans)
        if between and any(True for _ in module.get_submodule(path).parameters(recurse=False)):
            return False
    return True
