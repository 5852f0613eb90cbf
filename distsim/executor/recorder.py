"""Recording one executor rank's events: a :class:`Recorder` collects them during an iteration as marks of the rank's
clock (:mod:`distsim.executor.clock`) and resolves them into rows (stream, kind, name, layer, stage, micro-batch, start,
end) at its end; a block's tensor-parallel all-reduces (timed by :class:`RecordingComm`) are split out of the block's
compute (:func:`split_block`).

What a row says beyond that (key, bytes, peer, group: :mod:`distsim.executor.keys`) is kept beside the rows, by row
index (:attr:`Recorder.row_info`, :attr:`Recorder.send_info`), only for the rows that say something: the rows stay
the 8-tuples every reader of them takes apart."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from distsim.executor.clock import Clock, HostClock, Mark
from distsim.executor.keys import NO_INFO, Info, nbytes
from distsim.profiler.tp_comm import ProcessGroupComm, ReduceOp

Row = tuple[str, str, str, int, int, int, float, float]
"""(stream, kind, name, layer, stage, microbatch, start, end) of one event on this rank."""
Meta = tuple[str, str, str, int, int, int]
"""(stream, kind, name, layer, stage, microbatch) of an event whose times are still marks."""


_GATHERED = ("iteration", "rows", "p2p_sends", "p2p_recvs", "iteration_starts", "row_info", "send_info")
"""What a recorder pickles: its resolved rows (:meth:`Recorder.__getstate__`)."""

Piece = tuple[str, str, float, float]
"""(stream, kind, start, end) of a part of a block."""


def split_block(kind: str, start: float, end: float, comms: list[tuple[float, float]]) -> list[Piece]:
    """(stream, kind, start, end) rows of one block that ran from `start` to `end`: its compute before, between and
    after the tensor-parallel all-reduces it ran (`comms`, in order), and those all-reduces on the ``tp`` stream."""
    out: list[Piece] = []
    cursor = start
    for c_start, c_end in comms:
        if c_start > cursor:
            out.append(("compute", kind, cursor, c_start))
        out.append(("tp", "tp_allreduce", c_start, c_end))
        cursor = max(cursor, c_end)
    if end > cursor or not comms:
        out.append(("compute", kind, cursor, end))
    return out


@dataclass
class Recorder:
    """Collects this rank's events; tp collectives inside a block are split out of the block's compute.

    During an iteration an event's times are marks of the rank's clock (see :mod:`distsim.executor.clock`); the
    iteration's :meth:`finish` resolves them into ``rows`` (host-clock seconds). Where the clock's device spans differ
    from the host's (CUDA), the host's span of every call that launches work is a row on the ``host`` stream, kind
    ``launch``, with the event's name, and the host's wait for the device at the end is a row named ``synchronize``.
    """

    clock: Clock = field(default_factory=HostClock)
    iteration: int = 0
    rows: list[tuple[int, Row]] = field(default_factory=list)
    p2p_sends: list[tuple[int, tuple[Any, ...], Row]] = field(default_factory=list)
    p2p_recvs: list[tuple[int, tuple[Any, ...], float]] = field(default_factory=list)
    iteration_starts: dict[int, float] = field(default_factory=dict)
    row_info: dict[int, Info] = field(default_factory=dict)
    """Index in :attr:`rows` -> what that row says beyond its times (absent: nothing, :data:`NO_INFO`)."""
    send_info: dict[int, Info] = field(default_factory=dict)
    """The same for :attr:`p2p_sends`."""
    keys: Any = None
    """The rank's :class:`~distsim.executor.keys.EventKeys`, which names blocks' compute and tensor-parallel events
    (None: they get no key)."""
    tp_group: str = ""
    """The ranks of this rank's tensor-parallel group, as a row's ``group``."""
    _events: list[tuple[Meta, Mark, Mark, list[tuple[Mark, Mark, int]] | None, Info | None]] = field(
        default_factory=list
    )
    _sends: list[tuple[tuple[Any, ...], Meta, Mark, Mark, Info | None]] = field(default_factory=list)
    _recvs: list[tuple[tuple[Any, ...], Mark]] = field(default_factory=list)
    _comm: list[tuple[Mark, Mark, int]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        """What rank 0 gathers: the resolved rows (a clock holds CUDA events and streams)."""
        return {k: v for k, v in self.__dict__.items() if k in _GATHERED}

    def begin(self, iteration: int) -> None:
        self.iteration = iteration
        self._events, self._sends, self._recvs, self._comm = [], [], [], None
        self.iteration_starts[iteration] = self.clock.begin()

    def add(self, meta: Meta, start: Mark, end: Mark, host: tuple[float, float] | None = None,
            info: Info | None = None) -> None:  # fmt: skip
        """An event between two marks, what its row says beyond them (`info`), and the host's span launching it."""
        self._events.append((meta, start, end, None, info))
        if host is not None:
            self.launched(meta, *host)

    def launched(self, meta: Meta, start: float, end: float) -> None:
        """The host's span (perf_counter) of the call that launched an event (a ``host`` row where it differs)."""
        if self.clock.host_rows:
            _stream, _kind, name, layer, stage, mb = meta
            self.rows.append((self.iteration, ("host", "launch", name, layer, stage, mb, start, end)))

    @contextmanager
    def span(self, stream: str, kind: str, name: str, layer: int, stage: int, mb: int,
             info: Info | None = None) -> Iterator[None]:  # fmt: skip
        """An event on the current stream: whatever the body enqueues there."""
        host = self.clock.now()
        start = self.clock.mark()
        try:
            yield
        finally:
            self.add((stream, kind, name, layer, stage, mb), start, self.clock.mark(), (host, self.clock.now()), info)

    @contextmanager
    def block(self, kind: str, name: str, layer: int, stage: int, mb: int) -> Iterator[None]:
        """A block's forward or backward; the tp all-reduces it runs are split out at :meth:`finish`."""
        outer, comms = self._comm, []
        self._comm = comms
        host = self.clock.now()
        start = self.clock.mark()
        try:
            yield
        finally:
            end = self.clock.mark()
            self._comm = outer  # a recomputed block runs inside the backward of the block it serves
            self.add_block(("compute", kind, name, layer, stage, mb), start, end, comms, (host, self.clock.now()))

    def add_block(self, meta: Meta, start: Mark, end: Mark, comms: list[tuple[Mark, Mark, int]],
                  host: tuple[float, float]) -> None:  # fmt: skip
        """A block's event between two marks, with the tp collectives it ran (split out at :meth:`finish`)."""
        self._events.append((meta, start, end, comms, None))
        self.launched(meta, *host)

    def comm_into(self, comms: list[tuple[Mark, Mark, int]] | None) -> None:
        """Where the tp collectives that run next belong (a block's backward, timed by hooks); None: nowhere."""
        self._comm = comms

    def collective(self, start: Mark, end: Mark, size: int = 0) -> None:
        """A tp collective of `size` bytes between two marks, inside the block that runs it."""
        if self._comm is not None:
            self._comm.append((start, end, size))

    def send(self, key: tuple[Any, ...], meta: Meta, start: Mark, end: Mark, host: tuple[float, float],
             info: Info | None = None) -> None:  # fmt: skip
        """A p2p send; its row ends when the receiver has the data (:func:`distsim.executor.worker._assemble`)."""
        self._sends.append((key, meta, start, end, info))
        self.launched(meta, *host)

    def received(self, key: tuple[Any, ...], mark: Mark) -> None:
        self._recvs.append((key, mark))

    def finish(self, stage: int) -> float:
        """End the iteration: wait for the device, resolve every mark; the host time the iteration ends at."""
        waiting = self.clock.now()
        end, t = self.clock.finish()
        it = self.iteration
        if self.clock.host_rows:
            self.rows.append((it, ("host", "launch", "synchronize", -1, stage, -1, waiting, end)))
        for (stream, kind, name, layer, stg, mb), start, stop, comms, info in self._events:
            if comms is None:
                self._row(it, (stream, kind, name, layer, stg, mb, t[start], t[stop]), info)
                continue
            sizes = iter([size for _x, _y, size in comms])
            compute, tp = self._block_info(kind, name, layer)
            for s, k, a, b in split_block(kind, t[start], t[stop], [(t[x], t[y]) for x, y, _ in comms]):
                got = compute if s == "compute" else (tp[0], next(sizes), -1, tp[3])
                self._row(it, (s, k, name, layer, stg, mb, a, b), got)
        for key, (stream, kind, name, layer, stg, mb), start, stop, info in self._sends:
            if info is not None and info != NO_INFO:
                self.send_info[len(self.p2p_sends)] = info
            self.p2p_sends.append((it, key, (stream, kind, name, layer, stg, mb, t[start], t[stop])))
        self.p2p_recvs += [(it, key, t[mark]) for key, mark in self._recvs]
        self._events, self._sends, self._recvs = [], [], []
        return end

    def _row(self, it: int, row: Row, info: Info | None) -> None:
        if info is not None and info != NO_INFO:
            self.row_info[len(self.rows)] = info
        self.rows.append((it, row))

    def _block_info(self, kind: str, name: str, layer: int) -> tuple[Info, Info]:
        """What a block's compute rows and its tp all-reduces' rows say (the all-reduces' bytes their own)."""
        keys = self.keys
        compute = keys.compute(kind, name, layer) if keys is not None else ""
        tp = keys.tp_allreduce(kind, name, layer) if keys is not None else ""
        return (compute, 0, -1, ""), (tp, 0, -1, self.tp_group)


class RecordingComm(ProcessGroupComm):
    """Tensor-parallel all-reduces over a process group, timed into the recorder (marks on the current stream,
    which a synchronous NCCL collective makes wait for it)."""

    def __init__(self, group: Any, recorder: Recorder) -> None:
        super().__init__(group)
        self.recorder = recorder

    def all_reduce(self, tensor: Tensor, op: ReduceOp = "sum") -> Tensor:
        start = self.recorder.clock.mark()
        out = super().all_reduce(tensor, op)
        self.recorder.collective(start, self.recorder.clock.mark(), nbytes(tensor))
        return out
