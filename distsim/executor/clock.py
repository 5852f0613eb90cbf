"""The executor's clocks: when each recorded event ran on the device, read on the host's ``perf_counter`` clock.

The runtime asks a clock for *marks* (points on the stream that is current when the mark is taken) and gets their
times only after the iteration's end, so taking a mark never makes the host wait for the device.

* :class:`HostClock` (CPU): a mark is ``time.perf_counter()`` now. CPU work is synchronous, so the host's span of a
  call is the device's span; there is no separate host row.
* :class:`CudaClock` (GPU): a mark is a ``torch.cuda.Event(enable_timing=True)`` recorded on the current stream; the
  device completes it when the stream reaches it (all work enqueued before it on that stream is done). After the
  iteration's final ``torch.cuda.synchronize()`` every mark is resolved with ``anchor.elapsed_time(event)`` against
  one anchor event per iteration, recorded at the iteration's start on the idle device (right after a synchronize)
  and paired with the host time taken right after recording it (:func:`host_times`). The error of a mapped time is
  the device's latency in picking up the anchor (microseconds) plus the drift of the two clocks over one iteration.

Asynchronous work (a gradient all-reduce overlapped with backward, a non-blocking send) runs on NCCL's internal
stream, where no event can be recorded from Python. :meth:`Clock.side` runs it from a side stream of our own (one per
key, created once) that first waits for the current stream: ProcessGroupNCCL makes its stream wait for the side
stream at enqueue, and :meth:`Clock.completion` / :meth:`Clock.enqueued` call ``work.wait()`` there, which makes the
*side stream* (not the host) wait for NCCL's end event, then record a mark. The start mark thus completes when the
current stream has reached the launch (the NCCL kernel's earliest start) and when the side stream's previous
operations are done (as NCCL's stream, in order, would have them), and the end mark when the NCCL kernel is done.
Synchronous collectives (tensor-parallel, bulk all-reduce, blocking send, receive) make the current stream wait for
NCCL's stream, so marks on the current stream before and after the call bracket them exactly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

Mark = int
"""Index of a point in time taken during the current iteration; resolved by :meth:`Clock.finish`."""


def host_times(anchor_host_s: float, elapsed_ms: Sequence[float]) -> list[float]:
    """Device marks on the host clock: the anchor's host time plus each mark's elapsed device time since the anchor.

    `elapsed_ms` are ``anchor.elapsed_time(event)`` values (milliseconds, CUDA's unit)."""
    return [anchor_host_s + ms / 1e3 for ms in elapsed_ms]


class Clock:
    """Marks on the device's streams during one iteration, resolved to host-clock seconds after it."""

    name = "perf_counter"
    host_rows = False
    """Whether host launch spans differ from device spans (and are recorded as a ``host`` stream)."""

    def now(self) -> float:
        """The host clock (for the host's own spans)."""
        return time.perf_counter()

    def begin(self) -> float:
        """Start an iteration (forget earlier marks); the host time it starts at."""
        raise NotImplementedError

    def mark(self) -> Mark:
        """A point on the current stream."""
        raise NotImplementedError

    def side(self, key: str) -> Any:
        """Context in which asynchronous work is launched from a side stream that first waits for the current one."""
        return nullcontext()

    def enqueued(self, works: Sequence[Any]) -> Mark:
        """End of asynchronous operations launched in :meth:`side`, without the host waiting: on the device, when they
        have completed; on the host clock, when their launch returned (the host cannot see completion)."""
        raise NotImplementedError

    def completion(self, work: Any) -> Mark:
        """When an asynchronous collective launched in :meth:`side` completes, without the host waiting for it
        (settled by :meth:`wait` at the latest)."""
        raise NotImplementedError

    def wait(self, work: Any, mark: Mark) -> None:
        """The current stream (or the host) waits for `work`, whose :meth:`completion` is `mark`."""
        work.wait()

    def finish(self) -> tuple[float, list[float]]:
        """End the iteration (on a GPU: synchronise the device); the host time after it and every mark's time."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """What the trace's provenance records about its times."""
        raise NotImplementedError


class HostClock(Clock):
    """``time.perf_counter`` (CLOCK_MONOTONIC, shared by the processes of one machine): right for synchronous work."""

    def __init__(self) -> None:
        self._times: list[float] = []
        self._lock = threading.Lock()

    def begin(self) -> float:
        self._times = []
        return time.perf_counter()

    def mark(self) -> Mark:
        with self._lock:
            self._times.append(time.perf_counter())
            return len(self._times) - 1

    def enqueued(self, works: Sequence[Any]) -> Mark:
        return self.mark()

    def completion(self, work: Any) -> Mark:
        with self._lock:
            self._times.append(float("nan"))
            mark = len(self._times) - 1
        work.get_future().then(lambda _f: self._settle(mark))  # on the backend's thread, when the work completes
        return mark

    def wait(self, work: Any, mark: Mark) -> None:
        work.wait()
        self._settle(mark)  # the callback may not have run yet: the work is done now at the latest

    def _settle(self, mark: Mark) -> None:
        now = time.perf_counter()
        with self._lock:
            if self._times[mark] != self._times[mark]:  # NaN: the first to see the work done sets it
                self._times[mark] = now

    def finish(self) -> tuple[float, list[float]]:
        end = time.perf_counter()
        with self._lock:
            return end, list(self._times)

    def describe(self) -> dict[str, Any]:
        return {"device_clock": self.name, "host_clock": "perf_counter", "host_rows": False, "anchor": None,
                "streams": dict.fromkeys(("compute", "tp", "p2p", "dp"), "perf_counter"),
                "note": "synchronous work: the host's span of each call is the device's; no host stream"}  # fmt: skip


class CudaClock(Clock):
    """CUDA events on the streams work runs on, mapped to ``perf_counter`` by one anchor per iteration."""

    name = "cuda_event"
    host_rows = True

    def __init__(self, device: Any) -> None:
        import torch

        self._torch = torch
        self.device = device
        self._events: list[Any] = []  # reused across iterations (every one is complete after finish())
        self._used = 0
        self._streams: dict[str, Any] = {}
        self._anchor = torch.cuda.Event(enable_timing=True)
        self._anchor_host_s = 0.0

    def begin(self) -> float:
        self._torch.cuda.synchronize(self.device)
        self._anchor.record(self._torch.cuda.current_stream(self.device))
        self._anchor_host_s = time.perf_counter()  # the device, idle, records the anchor within microseconds
        self._used = 0
        return self._anchor_host_s

    def mark(self) -> Mark:
        if self._used == len(self._events):
            self._events.append(self._torch.cuda.Event(enable_timing=True))
        self._events[self._used].record(self._torch.cuda.current_stream(self.device))
        self._used += 1
        return self._used - 1

    @contextmanager
    def side(self, key: str) -> Iterator[None]:
        torch = self._torch
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            yield

    def enqueued(self, works: Sequence[Any]) -> Mark:
        for work in works:
            work.wait()  # ProcessGroupNCCL: the current (side) stream waits for NCCL's stream; the host does not
        return self.mark()

    def completion(self, work: Any) -> Mark:
        return self.enqueued([work])

    def finish(self) -> tuple[float, list[float]]:
        self._torch.cuda.synchronize(self.device)
        end = time.perf_counter()
        elapsed = [self._anchor.elapsed_time(e) for e in self._events[: self._used]]
        return end, host_times(self._anchor_host_s, elapsed)

    def describe(self) -> dict[str, Any]:
        return {
            "device_clock": self.name, "host_clock": "perf_counter", "host_rows": True,
            "anchor": "per iteration: torch.cuda.synchronize(), an event recorded on the current stream, perf_counter "
                      "right after; a device time is the anchor's host time + anchor.elapsed_time(event)",
            "streams": {
                "compute": "cuda_event on the current stream",
                "tp": "cuda_event on the current stream, which waits for the collective",
                "p2p": "cuda_event on a side stream per peer that waits for a non-blocking send (a blocking one: the "
                       "current stream); a row ends when the receiver's current stream has the data, if later",
                "dp": "cuda_event on a side stream that waits for an overlapped all-reduce (the current stream for the "
                      "bulk and tied all-reduces)",
                "host": "perf_counter around the calls that launch each event, and the final synchronize",
            },
        }  # fmt: skip


def clock_for(device: Any) -> Clock:
    """The clock of a rank's device: CUDA events on a GPU, the host clock on a CPU."""
    return CudaClock(device) if getattr(device, "type", "cpu") == "cuda" else HostClock()
