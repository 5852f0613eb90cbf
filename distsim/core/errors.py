"""Errors that name a user's mistake in one line.

Everything the user can get wrong (an unknown model, a strategy that does not fit the cluster, a malformed file)
raises a subclass of :class:`DistsimError`; the CLI prints its message on one line and exits with status 2.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class DistsimError(Exception):
    """Base class: a problem with the user's input, reported as one line (exit status 2 unless it says otherwise)."""

    exit_code = 2


class UnknownNameError(DistsimError, KeyError):
    """A model, cluster or schedule name that is not built in."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class StrategyError(DistsimError, ValueError):
    """A strategy that is invalid on its own or for the given model and cluster."""


class ScheduleError(DistsimError, ValueError):
    """A pipeline schedule that is malformed (bad action, missing or repeated micro-batch, deadlock)."""


class ModelFileError(DistsimError, ValueError):
    """A user model file (YAML/JSON) that cannot be read or does not describe a valid layer graph."""


class ClusterError(DistsimError, ValueError):
    """A cluster description that is inconsistent."""


class ProfileError(DistsimError, ValueError):
    """A profile database that is missing, malformed, of another schema version, or lacks events under --strict."""


def suggest(name: str, known: list[str]) -> str:
    """' (did you mean X?)' for the closest known name, or a list of known names."""
    import difflib

    close = difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f"; known: {', '.join(sorted(known))}"
