"""The search drivers' worker pool: independent evaluations in forked processes, stopped at once by Ctrl-C.

Every driver evaluates many independent items (a grid's configurations, DAPPLE's micro-batch counts) with the same
large inputs (model, cluster, costs). :func:`imap_unordered` hands those inputs to each worker once, when it
starts (inherited through fork, never pickled per task), and yields each item's result as it completes. Workers
ignore SIGINT, so Ctrl-C (which the terminal sends to every process of the group) reaches the parent alone: it
terminates the workers, drops the queued items and re-raises, and the command line reports "aborted" at once
instead of running the queue to its end.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

# In a worker process: the task and the inputs every task shares (set once by the pool's initializer).
_WORKER: dict[str, Any] = {}


def _start_worker(task: Callable[[Any, Any], Any], shared: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _WORKER.update(task=task, shared=shared)


def _run_in_worker(item: Any) -> Any:
    return _WORKER["task"](_WORKER["shared"], item)


def imap_unordered(
    task: Callable[[Any, Item], Result], shared: Any, items: Iterable[Item], workers: int
) -> Iterator[Result]:
    """``task(shared, item)`` for every item, in `workers` processes (1: in this process, in order), results in
    completion order. Stopping the iteration early, an error in a task, or Ctrl-C terminate the workers."""
    if workers <= 1:
        for item in items:
            yield task(shared, item)
        return
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
    pool = ctx.Pool(workers, initializer=_start_worker, initargs=(task, shared))
    try:
        yield from pool.imap_unordered(_run_in_worker, items)
        pool.close()
    except BaseException:  # KeyboardInterrupt, an error in a task, or the caller stopped iterating
        pool.terminate()
        raise
    finally:
        pool.join()
