"""Perfetto's native protobuf trace format, encoded by hand (no protobuf dependency).

A trace file is a ``Trace`` message: a sequence of ``TracePacket`` s, each written as field 1 (length-delimited).
Field numbers are Perfetto's (``protos/perfetto/trace/trace.proto``, ``trace_packet.proto``,
``track_event/track_event.proto``, ``track_descriptor.proto``, ``process_descriptor.proto``,
``thread_descriptor.proto``, ``debug_annotation.proto``, ``interned_data/interned_data.proto``); the tests decode
what is written here with a decoder of their own.

Besides scalar encoders this module has :class:`Records`, which encodes one variable-length record per row of numpy
columns at once (varints, constants and length-prefixed sub-messages), so millions of slices are encoded without a
Python loop per slice.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

# --- Trace / TracePacket
TRACE_PACKET = 1
PACKET_TIMESTAMP = 8
PACKET_SEQUENCE_ID = 10  # trusted_packet_sequence_id
PACKET_TRACK_EVENT = 11
PACKET_INTERNED_DATA = 12
PACKET_SEQUENCE_FLAGS = 13
PACKET_TRACK_DESCRIPTOR = 60
PACKET_FIRST_ON_SEQUENCE = 87
SEQ_INCREMENTAL_STATE_CLEARED = 1
SEQ_NEEDS_INCREMENTAL_STATE = 2
# --- TrackDescriptor
TRACK_UUID = 1
TRACK_NAME = 2
TRACK_PROCESS = 3
TRACK_THREAD = 4
TRACK_PARENT_UUID = 5
TRACK_CHILD_ORDERING = 11
TRACK_SIBLING_ORDER_RANK = 12
TRACK_PROCESS_ORDERING = 19
TRACK_THREAD_ORDERING = 20
CHILD_ORDERING_EXPLICIT = 3
ORDERING_EXPLICIT = 1  # ProcessOrdering / ThreadOrdering
# --- ProcessDescriptor / ThreadDescriptor
PROCESS_PID = 1
PROCESS_NAME = 6
THREAD_PID = 1
THREAD_TID = 2
THREAD_NAME = 5
# --- TrackEvent
EVENT_CATEGORY_IIDS = 3
EVENT_DEBUG_ANNOTATIONS = 4
EVENT_TYPE = 9
EVENT_NAME_IID = 10
EVENT_TRACK_UUID = 11
TYPE_SLICE_BEGIN = 1
TYPE_SLICE_END = 2
# --- InternedData (each entry: iid = 1, name = 2)
INTERNED_EVENT_CATEGORIES = 1
INTERNED_EVENT_NAMES = 2
INTERNED_DEBUG_ANNOTATION_NAMES = 3
INTERNED_IID = 1
INTERNED_NAME = 2
# --- DebugAnnotation
ANNOTATION_NAME_IID = 1
ANNOTATION_INT_VALUE = 4

VARINT, LENGTH_DELIMITED = 0, 2
_U64 = (1 << 64) - 1


_SMALL = [bytes((v,)) for v in range(0x80)]


def varint(value: int) -> bytes:
    """Base-128 varint; negative values as their 64-bit two's complement (int64 fields), 10 bytes."""
    if 0 <= value < 0x80:
        return _SMALL[value]
    value &= _U64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@functools.cache
def key(field_number: int, wire_type: int) -> bytes:
    return varint(field_number << 3 | wire_type)


def uint_field(field_number: int, value: int) -> bytes:
    return key(field_number, VARINT) + varint(value)


def bytes_field(field_number: int, payload: bytes) -> bytes:
    return key(field_number, LENGTH_DELIMITED) + varint(len(payload)) + payload


def str_field(field_number: int, text: str) -> bytes:
    return bytes_field(field_number, text.encode("utf-8"))


def packet(payload: bytes) -> bytes:
    """One TracePacket as it stands in the Trace message."""
    return bytes_field(TRACE_PACKET, payload)


def interned_entries(field_number: int, names: list[str]) -> bytes:
    """Interned-data entries with iids 1, 2, ... (0 is not a valid iid)."""
    return b"".join(
        bytes_field(field_number, uint_field(INTERNED_IID, i) + str_field(INTERNED_NAME, s))
        for i, s in enumerate(names, start=1)
    )


_VARINT_LIMITS = np.asarray([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)


def varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varints of an integer array: an (n, width) uint8 matrix (each row left-aligned) and each row's length."""
    v = np.asarray(values).astype(np.int64).astype(np.uint64)  # negatives: two's complement, as int64 fields
    lengths = np.searchsorted(_VARINT_LIMITS, v, side="right").astype(np.int64) + 1
    width = int(lengths.max()) if len(v) else 1
    shifts = np.arange(width, dtype=np.uint64) * np.uint64(7)
    matrix = ((v[:, None] >> shifts[None, :]) & np.uint64(0x7F)).astype(np.uint8)
    more = np.arange(width)[None, :] < (lengths[:, None] - 1)
    matrix[more] |= 0x80
    return matrix, lengths


@dataclass
class Records:
    """One byte record per row, built from parts that are appended in order (see the module docstring)."""

    n: int
    parts: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    """(matrix (n or 1, width) uint8, lengths (n,)) per part."""
    marks: dict[str, int] = field(default_factory=dict)
    """Name -> index of the part that starts there (see :meth:`offsets`)."""

    def const(self, data: bytes) -> Records:
        matrix = np.frombuffer(data, dtype=np.uint8)[None, :]
        self.parts.append((matrix, np.full(self.n, len(data), dtype=np.int64)))
        return self

    def varint(self, values: np.ndarray) -> Records:
        self.parts.append(varints(values))
        return self

    def uint_field(self, field_number: int, values: np.ndarray | int) -> Records:
        """A varint field: one value per row, or the same value (an int) in every row."""
        if isinstance(values, int):
            return self.const(uint_field(field_number, values))
        return self.const(key(field_number, VARINT)).varint(values)

    def mark(self, name: str) -> Records:
        self.marks[name] = len(self.parts)
        return self

    def message(self, field_number: int, sub: Records, present: np.ndarray | None = None) -> Records:
        """`sub` as a length-delimited field; rows where `present` is False get nothing."""
        head = Records(self.n).const(key(field_number, LENGTH_DELIMITED)).varint(sub.lengths())
        for name, index in sub.marks.items():
            self.marks[name] = len(self.parts) + len(head.parts) + index
        parts = head.parts + sub.parts
        if present is not None:
            keep = present.astype(np.int64)
            parts = [(m, lengths * keep) for m, lengths in parts]
        self.parts.extend(parts)
        return self

    def extend(self, other: Records) -> Records:
        for name, index in other.marks.items():
            self.marks[name] = len(self.parts) + index
        self.parts.extend(other.parts)
        return self

    def lengths(self) -> np.ndarray:
        total = np.zeros(self.n, dtype=np.int64)
        for _, lengths in self.parts:
            total += lengths
        return total

    def build(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The records back to back as one uint8 array, and where each marked part starts in it (per row)."""
        lengths = self.lengths()
        out = np.empty(int(lengths.sum()), dtype=np.uint8)
        position = np.cumsum(lengths) - lengths
        starts: dict[int, np.ndarray] = {}
        for index, (matrix, part_lengths) in enumerate(self.parts):
            starts[index] = position.copy()
            width = matrix.shape[1]
            columns = np.arange(width)
            if matrix.shape[0] == 1 and width and bool(np.all(part_lengths == width)):
                out[position[:, None] + columns[None, :]] = matrix
            else:
                mask = columns[None, :] < part_lengths[:, None]
                rows = np.broadcast_to(matrix, (self.n, width))
                out[(position[:, None] + columns[None, :])[mask]] = rows[mask]
            position += part_lengths
        return out, {name: starts[index] for name, index in self.marks.items()}
