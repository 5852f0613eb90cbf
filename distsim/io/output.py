"""Where an output goes, and how it is written there without harming what is at the path.

Every file distsim writes (traces, CSV tables, figures, plans, profiles) goes through :func:`open_output`:

* ``-`` streams to standard output;
* a path that names a character device, a FIFO or a socket (``/dev/null``, ``/dev/stdout``, a named pipe) is opened
  and written to, as every Unix tool does: it is never replaced, so it keeps its type;
* a symbolic link is followed (through chains of links) and never replaced itself: what it points to is written;
* a regular file, or a path that does not exist yet, is written atomically: to a temporary file in the same
  directory that is renamed over the target only once the write completed, so a crash or an error never leaves a
  half-written file that looks complete. A replaced file keeps its permission bits.

A stream whose reader goes away (``distsim ... --csv - | head``, a FIFO whose reader closed it) ends that output
quietly: the command goes on (its summary still reaches stderr) and exits 0, as the reader did not want more. While a
command runs, :func:`standard_output` makes ``sys.stdout`` a :class:`StandardOutput`: any write to it, an output's or
a summary's, that fails otherwise (a full disk under ``> file``, ``> /dev/full``, an I/O error) is the one-line
``standard output: cannot write (...)``, exit status 2 as for any other output that cannot be written, and nothing
is left for Python to fail on again at exit.

:func:`check_output` tells before any work is done whether a path can be written (directory exists and is
writable, not a directory, a figure's format is one matplotlib writes), so a long run never fails at its end.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from distsim.core.errors import DistsimError

STDOUT = "-"


class OutputError(DistsimError):
    """An output that cannot be written (missing directory, no permission, a full device, an unknown format)."""


def _describe(exc: OSError) -> str:
    return exc.strerror or exc.__class__.__name__


STDOUT_ERROR = "standard output: cannot write ({})"


def silence_stdout(stream: Any = None) -> None:
    """Point the file descriptor of `stream` (default: this process's stdout) at /dev/null, so that what is still
    buffered for it, and Python's flush at exit, go nowhere instead of failing again."""
    try:
        fd = (stream if stream is not None else sys.stdout).fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no descriptor (a test's capture): nothing buffered outside us
        pass


class _StdoutState:
    """What the text and binary views of one standard output share."""

    def __init__(self) -> None:
        self.reader_gone = False
        """The reader went away (a closed pipe): later writes go to /dev/null."""
        self.error: str | None = None
        """The one-line error once a write failed otherwise; every later write raises it again."""
        self.streaming = 0
        """Outputs of :func:`open_output` being written now: a reader that goes away stops them."""


class StandardOutput:
    """``sys.stdout`` while a command runs (:func:`standard_output`): the real stream, whose failures are handled
    here once for every writer (click.echo, print, pandas, json, an output of :func:`open_output`).

    A reader that went away (EPIPE): the descriptor is pointed at /dev/null and the write is dropped, quietly; an
    output of :func:`open_output` being written gets BrokenPipeError so that it stops (open_output ends it quietly).
    Any other failure (ENOSPC, EIO): the descriptor is pointed at /dev/null too and an :class:`OutputError`
    ``standard output: cannot write (...)`` is raised, now and on every later write."""

    def __init__(self, stream: Any, state: _StdoutState | None = None) -> None:
        self._stream = stream
        self._state = state if state is not None else _StdoutState()

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, isatty, ... of the real stream
        return getattr(self._stream, name)

    @property
    def buffer(self) -> StandardOutput:
        """The binary view, with the same handling."""
        return StandardOutput(self._stream.buffer, self._state)

    def write(self, data: Any) -> Any:
        return self._guarded(self._stream.write, data)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._guarded(self._stream.flush)

    @contextlib.contextmanager
    def streaming(self) -> Iterator[None]:
        """While an output of :func:`open_output` is written: a reader that goes away stops it."""
        self._state.streaming += 1
        try:
            yield
        finally:
            self._state.streaming -= 1

    def _guarded(self, op: Callable[..., Any], *args: Any) -> Any:
        state = self._state
        if state.error is not None:
            raise OutputError(state.error)
        if state.reader_gone and state.streaming:
            raise BrokenPipeError(errno.EPIPE, "the reader of standard output went away")
        try:
            return op(*args)
        except BrokenPipeError:
            state.reader_gone = True
            silence_stdout(self._stream)
            if state.streaming:
                raise
            return len(args[0]) if args else None
        except OSError as exc:
            state.error = STDOUT_ERROR.format(_describe(exc))
            silence_stdout(self._stream)
            raise OutputError(state.error) from None


@contextlib.contextmanager
def standard_output() -> Iterator[StandardOutput | None]:
    """Make ``sys.stdout`` a :class:`StandardOutput` for the block (a command's run), the real stream again after
    it; what is still buffered is flushed at the end, quietly (an error is reported by then, or being reported)."""
    real = sys.stdout
    if real is None or isinstance(real, StandardOutput):
        yield real
        return
    guarded = StandardOutput(real)
    sys.stdout = guarded  # type: ignore[assignment]
    try:
        yield guarded
    finally:
        with contextlib.suppress(OutputError, OSError, ValueError):
            guarded.flush()
        sys.stdout = real


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


def check_directory(directory: str | Path, option: str) -> None:
    """Raise an OutputError now if `directory` could not be made (with its missing parents) or written later:
    before a long run, as :func:`check_output` does for files; nothing is created."""
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{option} {path}: exists and is not a directory")
    existing = path
    while not existing.exists():  # the nearest ancestor that exists is where the directory would be made
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(f"{option} {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "directory is not writable" if existing == path else f"cannot create it in {existing} (not writable)"
        raise OutputError(f"{option} {path}: {what}")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def open_output(path: str | Path, binary: bool = False) -> Iterator[IO[Any]]:
    """A file object to write the output at `path` to (see the module docstring for what each kind of path gets).

    An OSError while writing becomes an OutputError naming the path (``standard output`` for ``-``); a regular file
    is then left as it was. A stream whose reader went away ends the output quietly (the block is left early).
    """
    encoding = None if binary else "utf-8"
    mode = "wb" if binary else "w"
    if str(path) == STDOUT:
        stream = sys.stdout
        try:
            if binary:
                stream.flush()  # what the text layer holds goes first
                stream = stream.buffer
            with stream.streaming() if isinstance(stream, StandardOutput) else contextlib.nullcontext():
                yield stream
                stream.flush()
        except BrokenPipeError:  # the reader went away: this output ends here, quietly
            pass
        except OSError as exc:
            raise OutputError(STDOUT_ERROR.format(_describe(exc))) from None
        return
    p = Path(path)
    kind = _kind(p)
    if kind == "directory":
        raise OutputError(f"{p}: is a directory")
    if kind == "special":
        try:
            with open(p, mode, encoding=encoding) as fh:
                yield fh
        except BrokenPipeError:  # a FIFO's reader went away: this output ends here, quietly, as on stdout
            pass
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
