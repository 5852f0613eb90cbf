"""Where an output goes, and how it is written there without harming what is at the path.

Every file distsim writes (traces, CSV tables, figures, plans, profiles) goes through :func:`open_output`:

* ``-`` streams to standard output;
* a path that names a character device, a FIFO or a socket (``/dev/null``, ``/dev/stdout``, a named pipe) is opened
  and written to, as every Unix tool does: it is never replaced, so it keeps its type;
* a symbolic link is followed (through chains of links) and never replaced itself: what it points to is written;
* a regular file, or a path that does not exist yet, is written atomically: to a temporary file in the same
  directory that is renamed over the target only once the write completed, so a crash or an error never leaves a
  half-written file that looks complete. A replaced file keeps its permission bits.

:func:`check_output` tells before any work is done whether a path can be written (directory exists and is
writable, not a directory, a figure's format is one matplotlib writes), so a long run never fails at its end.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from distsim.errors import DistsimError

STDOUT = "-"


class OutputError(DistsimError):
    """An output that cannot be written (missing directory, no permission, a full device, an unknown format)."""


def _describe(exc: OSError) -> str:
    return exc.strerror or exc.__class__.__name__


def _kind(path: Path) -> str:
    """'new', 'regular', 'directory' or 'special' (device, FIFO, socket) for what `path` names, links followed."""
    try:
        mode = os.stat(path).st_mode  # the kernel follows links, also /dev/stdout's /proc/self/fd/1
    except FileNotFoundError:
        return "new"
    except OSError as exc:
        raise OutputError(f"{path}: cannot write ({_describe(exc)})") from None
    if stat.S_ISDIR(mode):
        return "directory"
    return "regular" if stat.S_ISREG(mode) else "special"


def _target(path: Path, kind: str) -> Path:
    """The file an atomic write replaces: a symbolic link's final target, never the link itself."""
    return Path(os.path.realpath(path)) if kind in ("regular", "new") else path


def is_stdout(path: str | Path | None) -> bool:
    """Whether `path` writes to this process's standard output: ``-``, or a name for the same file (/dev/stdout)."""
    if path is None or str(path) == "":
        return False
    if str(path) == STDOUT:
        return True
    try:
        return os.path.samestat(os.stat(path), os.fstat(sys.stdout.fileno()))
    except (OSError, ValueError, AttributeError):  # no such path, or stdout is not a real file (a test's capture)
        return False


def figure_formats() -> set[str]:
    """File formats matplotlib writes (png, svg, pdf, ...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return set(FigureCanvasBase.get_supported_filetypes())


def check_output(path: str | Path | None, option: str, figure: bool = False, stream_ok: bool = True) -> None:
    """Raise an OutputError naming `option` now if `path` could not be written later; None passes.

    `stream_ok` False: the output must be a file that can be read back (a profile that is extended, a trace with
    a Chrome trace beside it), so ``-``, devices and FIFOs are refused."""
    if path is None or str(path) == "":
        return
    if str(path) == STDOUT:
        if not stream_ok:
            raise OutputError(f"{option} needs a file name, not '-'")
        return
    p = Path(path)
    if figure:
        suffix = p.suffix.lstrip(".").lower()
        formats = figure_formats()
        if suffix not in formats:
            raise OutputError(f"{option} {p}: cannot write a figure as {suffix or 'a file without extension'!r}; "
                              f"use one of {', '.join(sorted(formats))}")  # fmt: skip
    kind = _kind(p)
    if kind == "directory":
        raise OutputError(f"{option} {p}: is a directory")
    if kind == "special":
        if not stream_ok:
            raise OutputError(f"{option} {p}: needs a regular file, not a device or pipe")
        if not os.access(p, os.W_OK):
            raise OutputError(f"{option} {p}: not writable")
        return
    target = _target(p, kind)
    if kind == "regular" and not os.access(target, os.W_OK):
        raise OutputError(f"{option} {p}: not writable")
    directory = target.parent
    if not directory.is_dir():
        raise OutputError(f"{option} {p}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise OutputError(f"{option} {p}: directory {directory} is not writable")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def open_output(path: str | Path, binary: bool = False) -> Iterator[IO[Any]]:
    """A file object to write the output at `path` to (see the module docstring for what each kind of path gets).

    An OSError while writing becomes an OutputError naming the path; a regular file is then left as it was.
    """
    encoding = None if binary else "utf-8"
    mode = "wb" if binary else "w"
    if str(path) == STDOUT:
        stream = sys.stdout.buffer if binary else sys.stdout
        yield stream
        stream.flush()
        return
    p = Path(path)
    kind = _kind(p)
    if kind == "directory":
        raise OutputError(f"{p}: is a directory")
    if kind == "special":
        try:
            with open(p, mode, encoding=encoding) as fh:
                yield fh
        except BrokenPipeError:  # the reader went away: handled like a closed stdout
            raise
        except OSError as exc:
            raise OutputError(f"{p}: cannot write ({_describe(exc)})") from None
        return
    target = _target(p, kind)
    directory = target.parent
    if not directory.is_dir():
        raise OutputError(f"{p}: directory {directory} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise OutputError(f"{p}: cannot write ({_describe(exc)})") from None
    try:
        with os.fdopen(fd, mode, encoding=encoding) as fh:
            yield fh
        keep = stat.S_IMODE(os.stat(target).st_mode) if kind == "regular" else 0o666 & ~_umask()
        os.chmod(tmp, keep)  # mkstemp makes 0600; outputs get the usual (or the replaced file's) permissions
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OutputError(f"{p}: cannot write ({_describe(exc)})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
