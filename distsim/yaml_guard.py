"""YAML without alias bombs: measure what a document expands to before building it.

YAML anchors and aliases let a few hundred bytes describe a structure of billions of nodes ("billion laughs":
``&a [lol, lol, ...]``, ``&b [*a, *a, ...]``, ...). PyYAML builds such a document cheaply as a graph of shared
lists, but anything that walks it (a message quoting a value, ``str()``, a copy) expands it and runs until the
machine runs out of memory. :func:`load` first streams the document's parse events (no objects are built),
computing the size it has with every alias expanded from the sizes recorded for its anchors, and its nesting
depth; it refuses the document beyond either limit, or when an alias refers to a collection that contains it,
and only then builds it. The C parser (libyaml) is used when PyYAML has it: it is several times faster, and the
depth limit keeps its recursive composer within the C stack.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_DEPTH = 100
"""Deepest nesting of collections a document may have (real model, cluster and plan files nest fewer than 10)."""

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_OPEN = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


class ExpansionError(ValueError):
    """The document expands beyond the budget, nests too deeply, or has an alias that contains itself."""


def load(text: str, max_chars: int) -> Any:
    """``yaml.safe_load(text)``, refused with ExpansionError if the document, aliases expanded, would be larger than
    `max_chars` characters (a scalar counts its length plus one, a collection one) or nests deeper than MAX_DEPTH."""
    size = expanded_size(text, max_chars)
    if size > max_chars:
        raise ExpansionError(
            f"its aliases expand it to more than {max_chars:,} characters, the limit for this kind of file"
        )
    return yaml.load(text, Loader=_LOADER)  # SafeLoader or its C twin


def expanded_size(text: str, budget: int) -> int:
    """Characters of the document with every alias expanded, from one pass over its parse events; stops counting
    once past `budget` (returns a value > budget)."""
    anchors: dict[str, int] = {}  # anchor -> expanded size of its (finished) node
    stack: list[tuple[str | None, int]] = []  # open collections: (anchor, size so far)
    total = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, _OPEN):
            if len(stack) >= MAX_DEPTH:
                raise ExpansionError(f"it nests collections more than {MAX_DEPTH} deep")
            stack.append((event.anchor, 1))
            continue
        if isinstance(event, _CLOSE):
            anchor, size = stack.pop()
        elif isinstance(event, yaml.ScalarEvent):
            anchor, size = event.anchor, len(event.value) + 1
        elif isinstance(event, yaml.AliasEvent):
            if any(event.anchor == a for a, _ in stack):
                raise ExpansionError(f"alias *{event.anchor} refers to a collection that contains it")
            anchor, size = None, anchors.get(event.anchor, 0)  # an unknown alias: yaml.load reports it
        else:
            continue
        if anchor is not None:
            anchors[anchor] = size
        if stack:
            parent_anchor, parent_size = stack[-1]
            stack[-1] = (parent_anchor, parent_size + size)
        else:
            total += size
        if total > budget or (stack and stack[-1][1] > budget):
            return budget + 1
    return total
