"""A package's public names imported from their modules when first used (PEP 562 module ``__getattr__``).

``import distsim`` and ``import distsim.cli`` then start in a tenth of a second, before the simulator, pandas,
networkx or numpy are loaded by a command that needs them, while ``from distsim import simulate`` works as before.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, names: Mapping[str, str], namespace: dict[str, Any]) -> tuple[
        Callable[[str], Any], Callable[[], list[str]]]:  # fmt: skip
    """The ``__getattr__`` and ``__dir__`` of `package`, whose public `names` (name -> module) load on first use and
    are then kept in its `namespace` (its ``globals()``)."""

    def getattr_(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(names))

    return getattr_, dir_
