"""One forward pass of a user's torch module seen through hooks, and the modules that become its layers.

Every module call is numbered in order with the tensors autograd saves for backward (``saved_tensors_hooks``), so
that later analysis can place each in a layer. The candidate layers are *repeated blocks*: siblings of one class with
the same parameter shapes (GPT-2's ``transformer.h.0 .. h.23``), the group holding the most parameters first (the
shallower on a tie), taken if the pass calls each once, one after another, with no module holding parameters called
between them. Failing that, the children of the module's body (the outermost module with more than one child) when
they pass the same test; failing that, none (the whole module is one layer).

Parameters a module call receives as arguments are recorded with the call: megatron-core's output layer gets the
word embedding's weight as ``weight=`` (a tied LM head) and owns no weight itself, so the modules' own parameters
alone would miss the tie. A module that recomputes its blocks (activation checkpointing) is recognised, by its
framework's settings before the pass (:func:`checkpointing`) or by what the pass shows (``Recording.checkpointed``):
its blocks' backward would be timed with their recomputation in it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from distsim.profiler.torch_user import TorchModelError, call_module, first_line, loss_of, snapshot, tensors_in


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


def checkpointing(root: nn.Module) -> str | None:
    """How the module is set to recompute its blocks in backward, by the frameworks' own settings, or None: a
    Hugging Face layer's ``gradient_checkpointing`` flag (what ``activation_checkpointing_enable()``, formerly
    ``gradient_checkpointing_enable()``, sets and ``is_activation_checkpointing`` reads), a megatron-core config's
    ``recompute_granularity`` (full or selective; found on any module holding the config, GPTModel or its
    TransformerBlock). Read before the forward pass: megatron's checkpoint fails only in backward, and its selective
    recomputation is fixed when the layers are made."""
    flagged = [path for path, m in root.named_modules() if _attribute(m, "gradient_checkpointing") is True]
    flagged = [p for p in flagged if not any(q.startswith(f"{p}.") or (not p and q) for q in flagged)]  # the layers
    if flagged:
        more = f" and {len(flagged) - 1} more" if len(flagged) > 1 else ""
        return f"Hugging Face activation checkpointing of {flagged[0] or 'the module'}{more}"
    for path, m in root.named_modules():
        config = _attribute(m, "config")
        granularity = _attribute(config, "recompute_granularity")
        if isinstance(granularity, str) and granularity:
            method = _attribute(config, "recompute_method")
            how = f"recompute_granularity={granularity!r}" + (f", recompute_method={method!r}" if method else "")
            return f"megatron-core {how} in {path + '.' if path else ''}config"
    return None


def _attribute(obj: Any, name: str) -> Any:
    """``getattr(obj, name, None)`` that a property raising something else than AttributeError does not break."""
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


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
    param_args: list[tuple[int, str, nn.Parameter]] = field(default_factory=list)
    """(sequence number of the call, module path, parameter) of every parameter a module call received as an
    argument."""
    checkpointed: str | None = None
    """How the pass showed checkpointing (recomputation in backward), when it did."""
    seq: int = 0
    output: Any = None
    loss: Tensor | None = None

    def tick(self) -> int:
        self.seq += 1
        return self.seq


def record(module: nn.Module, batch: Any, watch: set[str]) -> Recording:
    """Run forward and loss once, recording every module call (arguments and output of the `watch` ones), the
    parameters calls receive as arguments, the tensors saved for backward and signs of checkpointing."""
    rec = Recording()
    handles = []
    params = {id(p): p for p in module.parameters()}

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
                _note_call(rec, path, (args, kwargs), params, pack, None)
                return
            call = rec.calls[path] = Call(rec.tick())
            if path in watch:
                call.args, call.kwargs = snapshot(args), snapshot(kwargs)
            _note_call(rec, path, (args, kwargs), params, pack, call.enter)

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
    rec.checkpointed = rec.checkpointed or _checkpoint_node(rec.loss)
    return rec


def _note_call(rec: Recording, path: str, arguments: Any, params: dict[int, nn.Parameter], pack: Any,
               seq: int | None) -> None:  # fmt: skip
    """The parameters among a call's arguments (a parameter or a view of one: a tied weight handed to the module
    that uses it), at `seq` or, for a repeated call, at a new sequence number; and whether the call runs inside
    torch.utils.checkpoint without reentry, whose saved-tensor hooks then stand above the recording's own (`pack`)."""
    passed = []
    for t in tensors_in(arguments):
        key = id(t) if id(t) in params else id(t._base) if t._base is not None else None
        if key in params:
            passed.append(params[key])  # type: ignore[index]
    if passed:
        at = seq if seq is not None else rec.tick()
        rec.param_args += [(at, path, p) for p in passed]
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)  # private: skipped should it go
    if rec.checkpointed is None and top is not None:
        hooks = top(False)
        if hooks and hooks[0] is not pack and getattr(hooks[0], "__module__", "") == "torch.utils.checkpoint":
            rec.checkpointed = f"torch.utils.checkpoint of {path or 'the module'}"


def _checkpoint_node(loss: Tensor | None) -> str | None:
    """A checkpoint's backward in the loss's autograd graph (torch.utils.checkpoint with reentry, megatron-core's
    tensor_parallel.checkpoint: ``CheckpointFunctionBackward``), named; None without one."""
    seen: set[Any] = set()
    stack = [loss.grad_fn] if loss is not None else []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if "Checkpoint" in node.name():
            return f"a checkpoint's {node.name()} in its autograd graph"
        stack.extend(n for n, _ in node.next_functions)
    return None


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
