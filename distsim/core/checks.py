"""Checks of the numbers a user gives in a file or a spec: finite, in range, integral where a count is meant.

Python's ``float()`` and YAML (``.nan``, ``.inf``) and JSON (``NaN``, ``Infinity``) all accept non-finite numbers,
which would flow through the simulation as ``nan us`` or ``inf samples/s``; ``int()`` silently truncates ``2.5``
and overflows on ``1e400``. Every reader of a model, cluster, plan or profile file goes through these helpers, so a
bad number is one line naming where it is, which key, and what was given.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

from distsim.core.errors import DistsimError


def number(value: Any, what: str, error: type[DistsimError], minimum: float | None = 0.0) -> float:
    """`value` as a finite float (>= `minimum` unless None); `what` names it ("model.yaml layer 'a': forward_s")."""
    if isinstance(value, bool):
        raise error(f"{what} must be a number, got {value!r}")
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        raise error(f"{what} must be a number, got {_short(value)}") from None
    if not math.isfinite(out):
        raise error(f"{what} must be a finite number, got {_short(value)}")
    if minimum is not None and out < minimum:
        raise error(f"{what} must be >= {minimum:g}, got {_short(value)}")
    return out


def integer(value: Any, what: str, error: type[DistsimError], minimum: int = 1, maximum: int | None = None) -> int:
    """`value` as an integer in [minimum, maximum]: an int, an integral float (``1e3``) or a decimal string."""
    out: int | None = None
    parsed = value
    if isinstance(value, str):  # YAML 1.1 reads 1e9 (no dot) as a string
        with contextlib.suppress(ValueError):
            parsed = int(value.strip()) if value.strip().lstrip("+-").isdigit() else float(value)
    if isinstance(parsed, int) and not isinstance(parsed, bool):
        out = parsed
    elif isinstance(parsed, float) and parsed.is_integer():
        out = int(parsed)
    if out is None or out < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise error(f"{what} must be {kind}, got {_short(value)}")
    if maximum is not None and out > maximum:
        raise error(f"{what} is {out:,}, above the limit of {maximum:,}")
    return out


def positive_int(value: Any, what: str, error: type[DistsimError], maximum: int | None = None) -> int:
    """`value` as an integer >= 1 (and <= `maximum`)."""
    return integer(value, what, error, 1, maximum)


def _short(value: Any, limit: int = 60) -> str:
    """repr of a value, cut short (a user's value may be a whole nested structure)."""
    text = repr(value) if not isinstance(value, (dict, list)) else f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
