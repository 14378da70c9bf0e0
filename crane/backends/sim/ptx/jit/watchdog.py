"""One thread that ends compiled launches past their deadline (sets their stop flag, which the
compiled code polls at backward branches and the runner between calls).

Why not a ``threading.Timer`` per launch: starting and cancelling one costs about 40 µs, as
much as a small compiled launch's whole fixed cost, and a worker with a kernel time limit pays
it on every launch. Here a launch registers its deadline and callback in a heap (a lock and a
push) and cancels by marking its entry; cancelled entries are dropped when they reach the top
or, when they are more than half the heap, all at once (so a stream of short launches with long
deadlines does not grow it).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Callable

__all__ = ["Watch", "cancel", "pending", "watch"]


class Watch:
    """A registered deadline; ``cancel`` it when the launch has ended."""

    __slots__ = ("at", "fire", "live")

    def __init__(self, at: float, fire: Callable[[], None]) -> None:
        self.at = at
        self.fire = fire
        self.live = True


_cv = threading.Condition()
_heap: list[tuple[float, int, Watch]] = []
_seq = itertools.count()
_live = 0
_thread: threading.Thread | None = None


def watch(deadline: float, fire: Callable[[], None]) -> Watch:
    """Call ``fire`` (on the watchdog's thread) once ``time.monotonic()`` passes
    ``deadline``, unless cancelled first."""
    global _live, _thread
    w = Watch(deadline, fire)
    with _cv:
        heapq.heappush(_heap, (deadline, next(_seq), w))
        _live += 1
        if _thread is None:
            _thread = threading.Thread(target=_run, name="crane-ptx-jit-watchdog", daemon=True)
            _thread.start()
        if _heap[0][2] is w:  # the earliest now: the thread's wait must end sooner
            _cv.notify()
    return w


def cancel(w: Watch) -> None:
    """The launch ended: ``fire`` will not be called (if it has not been already)."""
    global _live, _heap
    with _cv:
        if not w.live:
            return
        w.live = False
        _live -= 1
        if len(_heap) > 64 and _live < len(_heap) // 2:
            _heap = [e for e in _heap if e[2].live]
            heapq.heapify(_heap)


def pending() -> int:
    """Entries in the heap, cancelled ones not yet dropped included (for tests)."""
    with _cv:
        return len(_heap)


def _run() -> None:
    global _live
    while True:
        with _cv:
            while _heap and not _heap[0][2].live:
                heapq.heappop(_heap)
            if not _heap:
                _cv.wait()
                continue
            at, _, w = _heap[0]
            left = at - time.monotonic()
            if left > 0:
                _cv.wait(left)
                continue
            heapq.heappop(_heap)
            w.live = False
            _live -= 1
        with contextlib.suppress(Exception):  # a callback only sets flags
            w.fire()
