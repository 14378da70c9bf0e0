"""The source's deadline on the destination: no progress for ``limit_s`` while waiting on it.

Why progress rather than a fixed deadline per step: a round carries as many bytes as the
session holds, so a long transfer of a big round is not a hang. What counts as progress is
anything the destination's side of the stream does: the gRPC stream taking a queued message
(it takes the next only once flow control lets the last one out, so a stopped destination stops
it within a socket buffer or two) and an acknowledgement arriving. The clock runs only while
the source waits on the destination (room in the outbox, an acknowledgement), never while the
source itself reads memory or waits for the guest's call at a batch boundary (that has its own
deadline). Past the limit the watchdog records why and cancels the call, which unblocks every
wait at once; the migration then fails with that reason and the session carries on here.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["Stall"]

log = logging.getLogger("crane.worker")


class Stall:
    """Watches one migration's waits on its destination ``to``; fires ``cancel`` once."""

    def __init__(self, to: str, limit_s: float) -> None:
        self.to = to
        self.limit_s = max(float(limit_s), 0.1)
        self.step = "starting the transfer"
        self.reason: str | None = None  # set once it fired
        self.cancel: Callable[[], object] | None = None
        self._last = time.monotonic()
        self._since: float | None = None  # when the current wait began (None: not waiting)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="migrate-deadline", daemon=True)
        self._thread.start()

    def touch(self) -> None:
        """The destination's side moved (a message taken, an acknowledgement)."""
        self._last = time.monotonic()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """The source waits on the destination for :attr:`step` inside this block."""
        self._since = time.monotonic()
        try:
            yield
        finally:
            self._since = None

    def _run(self) -> None:
        tick = min(0.2, self.limit_s / 4)
        while not self._done.wait(tick):
            since = self._since
            if since is None:
                continue
            idle = time.monotonic() - max(since, self._last)
            if idle < self.limit_s:
                continue
            self.reason = (
                f"destination {self.to} unresponsive: no progress for {self.limit_s:g} s "
                f"while {self.step}"
            )
            log.warning("%s; aborting the migration", self.reason)
            if self.cancel is not None:
                self.cancel()
            return

    def close(self) -> None:
        self._done.set()
