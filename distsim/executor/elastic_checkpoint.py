"""The elastic executor's checkpoint file: a header that says what the file holds, verified before anything is loaded.

Layout (format 2)::

    distsim-elastic-checkpoint\\n                          the magic line
    {"header": {...}, "sha256": "<64 hex>"}\\n              one line of JSON (keys sorted, no spaces)
    <payload_bytes bytes>                                  torch.save of the trainer's state

The header names the format version, the model (its spec string, and every parameter's name, shape and dtype), the
step reached, the hyper-parameters the ESTs are tied to (max workers, seed, micro-batch size, token-mask fraction,
learning rate), and the payload's length and SHA-256; ``sha256`` is the SHA-256 of the header's canonical JSON (keys
sorted, no spaces), so a damaged header is caught as surely as a damaged payload. Reading (:func:`read_checkpoint`)
checks, in this order and before anything is unpickled: the magic line, the header line, its digest, the version,
the fields and their values (a step >= 0, ...), the file's length against the payload's, the identity against the
run that resumes (model, parameters, hyper-parameters), the payload's SHA-256; only then is the payload loaded, with
``torch.load(weights_only=True)`` (tensors and plain containers, never arbitrary pickles), and it must agree with
the header. Every refusal is one line, ``cannot resume PATH: PROBLEM``.

Writing (:func:`write_checkpoint`) goes through :func:`distsim.io.output.open_output`: a temporary file in the target's
directory renamed over the target only when complete, removed on any error (a full disk is one line) and on SIGINT,
SIGTERM or SIGHUP arriving while it is written. The payload is streamed (hashed on its way to the file) and the
header, whose payload fields have fixed widths, is written again over its placeholder once the payload is known.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
from collections.abc import Mapping
from typing import IO, Any

from distsim.core.errors import DistsimError
from distsim.infra.launch import raising_on_signals
from distsim.io.output import open_output

MAGIC = b"distsim-elastic-checkpoint\n"
FORMAT = 2
MAX_HEADER_BYTES = 16 << 20
"""A header line longer than this is not one (a model's parameter list takes a few hundred bytes per tensor)."""
_CHUNK = 1 << 20
_WIDTH = 20  # payload_bytes is written as a zero-padded string of this many digits, so the header's length is known

#: The header's fields and their JSON types (bool is excluded from int wherever an int is wanted).
FIELDS: dict[str, type | tuple[type, ...]] = {
    "format": int, "model": str, "params": list, "step": int, "max_workers": int, "seed": int,
    "micro_batch_size": int, "mask_tokens": (int, float), "lr": (int, float), "payload_bytes": str,
    "payload_sha256": str,
}  # fmt: skip
IDENTITY = ("model", "max_workers", "seed", "micro_batch_size", "mask_tokens", "lr")
"""The header fields a resuming run must match (besides the parameters): what the ESTs' training is tied to."""


class CheckpointError(DistsimError):
    """A checkpoint that cannot be resumed: one line naming the file and the problem."""


def _refuse(path: str, problem: str) -> CheckpointError:
    return CheckpointError(f"cannot resume {path}: {problem}")


def params_spec(params: Mapping[str, Any]) -> list[list[Any]]:
    """[name, shape, dtype] of every named tensor, in order: the model's parameters as the header records them."""
    return [[name, list(t.shape), str(t.dtype).removeprefix("torch.")] for name, t in params.items()]


def header_for(state: Mapping[str, Any]) -> dict[str, Any]:
    """The header of a trainer's state (payload fields still to fill in)."""
    return {
        "format": FORMAT, "model": state["model"], "params": params_spec(state["params"]), "step": state["step"],
        "max_workers": state["max_workers"], "seed": state["seed"], "micro_batch_size": state["micro_batch_size"],
        "mask_tokens": state["mask_tokens"], "lr": state["lr"],
        "payload_bytes": "0" * _WIDTH, "payload_sha256": "0" * 64,  # placeholders of the final widths
    }  # fmt: skip


def _canonical(header: Mapping[str, Any]) -> bytes:
    return json.dumps(header, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _header_line(header: Mapping[str, Any]) -> bytes:
    digest = hashlib.sha256(_canonical(header)).hexdigest()
    return json.dumps({"header": header, "sha256": digest}, sort_keys=True, separators=(",", ":"),
                      allow_nan=False).encode() + b"\n"  # fmt: skip


# ------------------------------------------------------------------------------------------------------ writing
class _HashingWriter:
    """A write-only file object for torch.save: passes the bytes on to `fh`, counting and hashing them, and keeps
    the first exception a write raised (torch turns it into a RuntimeError; the writer re-raises the original)."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh, self.sha, self.count = fh, hashlib.sha256(), 0
        self.error: BaseException | None = None

    def write(self, data: Any) -> int:
        try:
            view = memoryview(data).cast("B")
            self.fh.write(view)
            self.sha.update(view)
            self.count += len(view)
            return len(view)
        except BaseException as exc:
            self.error = self.error or exc
            raise

    def flush(self) -> None:
        try:
            self.fh.flush()
        except BaseException as exc:
            self.error = self.error or exc
            raise


def torch_save(obj: Any, fh: IO[bytes]) -> _HashingWriter:
    """torch.save `obj` into `fh` through a hashing writer; an error of the file (a full disk) or an interruption
    while writing is raised as itself, not as torch's RuntimeError."""
    import torch

    writer = _HashingWriter(fh)
    try:
        torch.save(obj, writer)  # type: ignore[arg-type]
    except BaseException as exc:
        original = writer.error or _interruption(exc)
        if original is not None and original is not exc:
            raise original from None
        raise
    return writer


def _interruption(exc: BaseException | None) -> BaseException | None:
    """The file error or interruption behind `exc`: torch.save's writer, cleaning up after one, raises a RuntimeError
    of its own ("unexpected pos") whose context is the real cause."""
    while exc is not None:
        if isinstance(exc, (OSError, KeyboardInterrupt, SystemExit)):
            return exc
        exc = exc.__context__
    return None


def save_atomically(obj: Any, path: str) -> None:
    """torch.save `obj` at `path` atomically (:func:`distsim.io.output.open_output`): all of it or nothing, the
    temporary
    file removed on any error or signal; a full disk is an OutputError (one line)."""
    with raising_on_signals(signal.SIGTERM, signal.SIGHUP), open_output(path, binary=True) as fh:
        torch_save(obj, fh)


def write_checkpoint(state: Mapping[str, Any], path: str) -> None:
    """Write a trainer's state (:meth:`ElasticTrainer.state`) as a checkpoint file at `path` (module docstring)."""
    header = header_for(state)
    placeholder = _header_line(header)
    with raising_on_signals(signal.SIGTERM, signal.SIGHUP), open_output(path, binary=True) as fh:
        if not fh.seekable():
            raise DistsimError(f"--checkpoint-out {path}: needs a regular file")
        fh.write(MAGIC)
        fh.write(placeholder)
        writer = torch_save(dict(state), fh)
        header["payload_bytes"] = f"{writer.count:0{_WIDTH}d}"
        header["payload_sha256"] = writer.sha.hexdigest()
        final = _header_line(header)
        assert len(final) == len(placeholder)  # fixed-width fields: the header keeps its place
        fh.seek(len(MAGIC))
        fh.write(final)


# ------------------------------------------------------------------------------------------------------ reading
def read_header(path: str) -> tuple[dict[str, Any], int]:
    """The verified header of the checkpoint at `path`, and where its payload starts; nothing is unpickled. Checks
    the magic line, the header line and its digest, the version, the fields' types and values, and that the file is
    exactly as long as the header says."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(len(MAGIC))
            line = fh.readline(MAX_HEADER_BYTES + 1) if head == MAGIC else b""
    except OSError as exc:
        raise _refuse(path, f"cannot read it ({exc.strerror or exc})") from None
    if size == 0:
        raise _refuse(path, "the file is empty (not a distsim elastic checkpoint)")
    if head != MAGIC:
        if MAGIC.startswith(head):
            raise _refuse(path, f"truncated ({size} bytes, within the first line)")
        if head.startswith(b"PK\x03\x04"):
            raise _refuse(path, "not a distsim elastic checkpoint (a bare torch file: checkpoints before format 2 "
                          "had no header to verify; write a new one)")  # fmt: skip
        raise _refuse(path, "not a distsim elastic checkpoint")
    if not line.endswith(b"\n"):
        if len(MAGIC) + len(line) == size:
            raise _refuse(path, f"truncated ({size} bytes, within the header)")
        raise _refuse(path, f"corrupt header (no end of line within {MAX_HEADER_BYTES:,} bytes): the file is corrupt")
    try:
        outer = json.loads(line)
        header, digest = outer["header"], outer["sha256"]
        if not isinstance(header, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise _refuse(path, "corrupt header (not the header's JSON): the file is corrupt") from None
    try:
        canonical = _canonical(header)
    except ValueError:  # NaN or infinity
        canonical = b""
    if header.get("format") != FORMAT and type(header.get("format")) is int:  # another version may digest otherwise
        raise _refuse(path, f"checkpoint format {header['format']}; this distsim reads format {FORMAT}")
    if digest != hashlib.sha256(canonical).hexdigest():
        raise _refuse(path, "checksum mismatch in the header: the file is corrupt")
    for name, kind in FIELDS.items():
        value = header.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise _refuse(path, f"the header's {name!r} is {value!r}, not a {getattr(kind, '__name__', 'number')}")
    _check_values(path, header)
    start = len(MAGIC) + len(line)
    want = start + int(header["payload_bytes"])
    if size < want:
        raise _refuse(path, f"truncated ({size:,} of {want:,} bytes)")
    if size > want:
        raise _refuse(path, f"{size - want:,} bytes after the end of the checkpoint: the file is corrupt")
    return header, start


def _check_values(path: str, header: Mapping[str, Any]) -> None:
    if header["step"] < 0:
        raise _refuse(path, f"step {header['step']} is not a valid step")
    for name in ("max_workers", "micro_batch_size"):
        if header[name] < 1:
            raise _refuse(path, f"{name.replace('_', ' ')} {header[name]} is not valid (>= 1)")
    if not 0 <= header["mask_tokens"] < 1:
        raise _refuse(path, f"mask fraction {header['mask_tokens']} is not valid (in [0, 1))")
    if not header["lr"] > 0:
        raise _refuse(path, f"learning rate {header['lr']} is not valid (> 0)")
    digits, sha = header["payload_bytes"], header["payload_sha256"]
    if len(digits) != _WIDTH or not digits.isdigit() or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise _refuse(path, "the header's payload length or checksum is malformed: the file is corrupt")
    for entry in header["params"]:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                and isinstance(entry[1], list) and all(type(d) is int and d >= 0 for d in entry[1])
                and isinstance(entry[2], str)):  # fmt: skip
            raise _refuse(path, f"the header's parameter entry {entry!r} is malformed")


def check_identity(path: str, header: Mapping[str, Any], expect: Mapping[str, Any]) -> None:
    """Refuse a checkpoint made for another run: `expect` holds this run's IDENTITY fields, and ``params`` (from
    :func:`params_spec`) where the model is built."""
    if header["model"] != expect["model"]:
        raise _refuse(path, f"made for model {header['model']}, not {expect['model']}")
    if "params" in expect:
        mine = {name: (shape, dtype) for name, shape, dtype in expect["params"]}
        theirs = {name: (shape, dtype) for name, shape, dtype in header["params"]}
        if mine != theirs:
            name = next(n for n in [*mine, *theirs] if mine.get(n) != theirs.get(n))
            raise _refuse(path, f"its parameters are not those of {expect['model']} ({name}: "
                          f"{_describe(theirs.get(name))} in the file, {_describe(mine.get(name))} here)")  # fmt: skip
    for key in IDENTITY[1:]:
        if header[key] != expect[key]:
            raise _refuse(path, f"written with {key.replace('_', ' ')} {header[key]}, this run has {expect[key]}: "
                          "the hyper-parameters are tied to the ESTs, not the ranks")  # fmt: skip


def _describe(spec: tuple[list[int], str] | None) -> str:
    return "absent" if spec is None else f"{tuple(spec[0])} {spec[1]}"


def check_payload(path: str, header: Mapping[str, Any], start: int) -> None:
    """The payload's SHA-256 against the header's (read in chunks, nothing loaded)."""
    sha = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            fh.seek(start)
            for chunk in iter(lambda: fh.read(_CHUNK), b""):
                sha.update(chunk)
    except OSError as exc:
        raise _refuse(path, f"cannot read it ({exc.strerror or exc})") from None
    if sha.hexdigest() != header["payload_sha256"]:
        raise _refuse(path, "checksum mismatch: the file is corrupt")


def verify_checkpoint(path: str, expect: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """Everything that can be checked without loading: the header, the identity, the payload's checksum."""
    header, start = read_header(path)
    check_identity(path, header, expect)
    check_payload(path, header, start)
    return header, start


class _Window(io.RawIOBase):
    """bytes [start, start + length) of an open file, as a seekable file of its own (torch.load reads the payload's
    zip archive in place, without a copy)."""

    def __init__(self, fh: IO[bytes], start: int, length: int) -> None:
        super().__init__()
        self.fh, self.start, self.length, self.pos = fh, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.length}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self.length - self.pos))
        self.fh.seek(self.start + self.pos)
        data = self.fh.read(n)
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


def read_checkpoint(path: str, expect: Mapping[str, Any]) -> dict[str, Any]:
    """The state saved at `path`, after :func:`verify_checkpoint`: loaded as tensors and plain data only
    (weights_only), and checked to say what its header says."""
    import pickle

    import torch

    header, start = verify_checkpoint(path, expect)
    try:
        with open(path, "rb") as fh:
            state = torch.load(_Window(fh, start, int(header["payload_bytes"])), map_location="cpu",
                               weights_only=True)  # fmt: skip
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        raise _refuse(path, f"its payload cannot be loaded as tensors ({str(exc).splitlines()[0][:200]})") from None
    if not isinstance(state, dict):
        raise _refuse(path, f"its payload is a {type(state).__name__}, not a trainer's state")
    for key in ("step", *IDENTITY):
        if state.get(key) != header[key]:
            raise _refuse(path, f"its payload's {key} ({state.get(key)!r}) contradicts its header's ({header[key]!r})")
    params = state.get("params")
    if not (isinstance(params, dict) and all(isinstance(t, torch.Tensor) for t in params.values())
            and params_spec(params) == header["params"]):  # fmt: skip
        raise _refuse(path, "its payload's parameters contradict its header's")
    return state
