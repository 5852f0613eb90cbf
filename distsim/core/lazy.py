"""What is loaded or built only when first used.

* :func:`lazy_exports`: a package's public names imported from their modules when first used (PEP 562 module
  ``__getattr__``). ``import distsim`` and ``import distsim.cli`` then start in a tenth of a second, before the
  simulator, pandas, networkx or numpy are loaded by a command that needs them, while ``from distsim import
  simulate`` works as before.
* :class:`RowsOnDemand`: a sequence kept as arrays whose items are built as they are asked for (a placement's
  communication instances, the per-GPU figures of a symmetric simulation of 131,072 GPUs).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, overload

T = TypeVar("T")


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


class RowsOnDemand(Sequence[T]):
    """A sequence whose item i is built by :meth:`_row` when asked for; subclasses give ``__len__`` and ``_row``.
    Indexing follows a list's: negative indices count from the end, slices give lists, an index past the end raises
    IndexError (which ends iteration)."""

    def __len__(self) -> int:
        raise NotImplementedError

    def _row(self, i: int) -> T:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            return [self._row(i) for i in range(*index.indices(len(self)))]
        return self._row(range(len(self))[index])
