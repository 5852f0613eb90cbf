"""YAML without alias bombs: measure what a document expands to before building it.

YAML anchors and aliases let a few hundred bytes describe a structure of billions of nodes ("billion laughs":
``&a [lol, lol, ...]``, ``&b [*a, *a, ...]``, ...). PyYAML builds such a document cheaply as a graph of shared
lists, but anything that walks it (a message quoting a value, ``str()``, a copy) expands it and runs until the
machine runs out of memory. :func:`load` first streams the document's parse events (no objects are built),
computing the size it has with every alias expanded from the sizes recorded for its anchors, and its nesting
depth; it refuses the document beyond either limit, or when an alias refers to a collection that contains it,
and only then builds it. The C parser (libyaml) is used when PyYAML has it: it is several times faster, and the
depth limit keeps its recursive composer within the C stack.

Before any of that, :func:`flow_depth` reads the raw text for its deepest flow collection (``[[[[...``): the
parser's scanner reads all the brackets of such a document ahead before it reports the first event, so a nesting
limit of the parser's own (libyaml's since PyYAML 6.0.4) would answer first, in its own words, and none (older
releases) would recurse without bound. Block collections are reported one event at a time and are counted there.
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
    if flow_depth(text, MAX_DEPTH) > MAX_DEPTH:
        raise ExpansionError(f"it nests collections more than {MAX_DEPTH} deep")
    size = expanded_size(text, max_chars)
    if size > max_chars:
        raise ExpansionError(
            f"its aliases expand it to more than {max_chars:,} characters, the limit for this kind of file"
        )
    return yaml.load(text, Loader=_LOADER)  # SafeLoader or its C twin


_BLANK = " \t\r\n"
_NODE_STARTS = "-?:"  # "- ", "? " and ": " start a node (followed by a blank; "- " and "? " only where a node could
# start: inside a plain scalar, as in ":? [", they are its characters)


def flow_depth(text: str, limit: int) -> int:
    """The deepest nesting of flow collections (``[...]``, ``{...}``) in `text`, read lexically without PyYAML;
    stops counting once past `limit` (returns a value > limit).

    A bracket counts where YAML makes it an indicator: anywhere inside a flow collection, and where a node starts
    in block context (line start, after ``- ``, ``? ``, ``: ``), never inside a plain scalar (``a[1``), a quoted
    scalar, a comment or a block scalar (``|``, ``>``). The count is exact for well-formed documents and a bound
    for malformed ones, which the parser then reports."""
    depth = deepest = 0
    i, n = 0, len(text)
    at_start = True  # the next non-blank character starts a node
    line_indent = 0
    block_scalar_indent: int | None = None  # inside a block scalar: lines indented deeper than this are its text
    while i < n:
        c = text[i]
        if c == "\n":
            i += 1
            j = i
            while j < n and text[j] == " ":
                j += 1
            line_indent = j - i
            if block_scalar_indent is not None:
                if j < n and text[j] not in "\r\n" and line_indent <= block_scalar_indent:
                    block_scalar_indent = None
                else:
                    end = text.find("\n", j)
                    i = n if end < 0 else end
                    continue
            at_start = depth == 0 or at_start
            i = j
            continue
        if c in " \t\r":
            i += 1
            continue
        if c == "#" and (i == 0 or text[i - 1] in _BLANK):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if c in "[{" and (depth or at_start):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            at_start = True
        elif c in "]}" and depth:
            depth -= 1
            at_start = False
        elif (c == "," and depth) or (c in _NODE_STARTS and _indicator(text, i, depth) and (c == ":" or at_start)):
            at_start = True
        elif c in "'\"" and at_start:
            i = _quoted_end(text, i)
            at_start = False
            continue
        elif c in "|>" and at_start and not depth:
            block_scalar_indent = line_indent
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        else:
            at_start = False
        i += 1
    return deepest


def _indicator(text: str, i: int, depth: int) -> bool:
    """Whether the ``-``, ``?`` or ``:`` at `i` is an indicator (followed by a blank; ``:`` in flow context also
    directly after a key, as in ``{"a":1}``), not a character of a plain scalar."""
    return i + 1 == len(text) or text[i + 1] in _BLANK or (depth > 0 and text[i] == ":")


def _quoted_end(text: str, start: int) -> int:
    """The index after the quoted scalar opening at `start` (the end of the text if it is never closed)."""
    quote = text[start]
    i = start + 1
    while True:
        j = text.find(quote, i)
        if j < 0:
            return len(text)
        if quote == '"':
            backslashes = 0
            while text[j - 1 - backslashes] == "\\":
                backslashes += 1
            if backslashes % 2:
                i = j + 1
                continue
            return j + 1
        if text.startswith("''", j):  # an escaped quote inside a single-quoted scalar
            i = j + 2
            continue
        return j + 1


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
