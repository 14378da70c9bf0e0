"""GPU time of a session's launches and copies on a real GPU, from CUDA events.

A launch or an asynchronous copy returns before the device runs it, so the call's time says
nothing of the work. Each one is bracketed by two timing events recorded in its stream
(``cuEventRecord`` before and after); once the second has completed, ``cuEventElapsedTime``
is the time the stream spent on it: what the device took, measured by the device. Events are
pooled and the completed pairs are collected without waiting (``cuEventQuery``) after each
batch and before the session's accounting is published (:meth:`WorkTimer.settle`).

What is approximate: the interval runs from when the stream reached the first event to when it
passed the second, so work of *other* streams running at the same time shares the device in
that interval (overlapping kernels each count their whole interval, and the profile's shares
are clamped to its window); the event resolution is about half a microsecond. Pairs still
pending beyond :data:`MAX_PENDING` (a long queue of launches nobody waits for) are not timed:
those launches are counted, their time is not (logged once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.backends.cuda.driver import unwrap

__all__ = ["MAX_PENDING", "WorkTimer"]

log = logging.getLogger("crane.cuda")

#: Bracketed operations not yet collected, at most.
MAX_PENDING = 4096


class WorkTimer:
    """Times stream-ordered work with event pairs and reports it to ``sink(kind, name, ns,
    completed_at)`` (crane.engine.meter.Meter.work)."""

    def __init__(self, drv: Any, sink: Callable[[str, str, int, int], None]) -> None:
        self.drv = drv
        self.sink = sink
        self._free: list[Any] = []
        self._pending: list[tuple[str, str, Any, Any]] = []
        self._skipped = 0

    def _event(self) -> Any:
        if self._free:
            return self._free.pop()
        return unwrap("cuEventCreate", self.drv.cuEventCreate(0))  # 0: with timing

    def begin(self, stream: Any) -> Any:
        """Mark the start of an operation about to be enqueued in ``stream`` (None: this one is
        not timed, too many are pending)."""
        if len(self._pending) >= MAX_PENDING:
            self.settle()
            if len(self._pending) >= MAX_PENDING:
                if not self._skipped:
                    log.warning("more than %d operations pending: not timing some", MAX_PENDING)
                self._skipped += 1
                return None
        ev = self._event()
        unwrap("cuEventRecord", self.drv.cuEventRecord(ev, stream))
        return ev

    def end(self, kind: str, name: str, start: Any, stream: Any) -> None:
        """The operation begun at ``start`` was enqueued in ``stream``."""
        if start is None:
            return
        ev = self._event()
        unwrap("cuEventRecord", self.drv.cuEventRecord(ev, stream))
        self._pending.append((kind, name, start, ev))

    def cancel(self, start: Any) -> None:
        """The operation begun at ``start`` was not enqueued (it failed)."""
        if start is not None:
            self._free.append(start)

    def settle(self) -> None:
        """Report every bracketed operation that completed; keep the others."""
        if not self._pending:
            return
        d, keep = self.drv, []
        now = time.monotonic_ns()
        for item in self._pending:
            kind, name, start, end = item
            ret = d.cuEventQuery(end)
            if int(ret[0]) == CUresult.CUDA_ERROR_NOT_READY:
                keep.append(item)
                continue
            if int(ret[0]) == CUresult.CUDA_SUCCESS:
                err, ms = d.cuEventElapsedTime(start, end)
                if int(err) == CUresult.CUDA_SUCCESS:
                    self.sink(kind, name, int(ms * 1e6), now)
            # a failed query or elapsed time (a faulted context): the work is not timed
            self._free += (start, end)
        self._pending = keep

    def close(self) -> None:
        for _, _, start, end in self._pending:
            self._free += (start, end)
        self._pending = []
        for ev in self._free:
            self.drv.cuEventDestroy(ev)
        self._free = []
