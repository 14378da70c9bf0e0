"""The worker's side of the call ring's bulk area (:mod:`crane.wire.ring_bulk`).

At a ring handshake the worker makes a bulk area and sends its descriptor beside the ring's;
while the guest stays attached, the session's codec reads staged copies' bytes from it and
writes staged reads into it (:mod:`crane.engine.staged`). When the drain ends (the guest left,
the session parked or moved) the area is closed on both sides, so a guest thread streaming
into it stops and resends its copy on the path it resumes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable

from crane.engine.engine import Engine
from crane.wire.ring_bulk import DEFAULT_BULK_CAP, BulkArea, bulk_available

__all__ = ["WorkerBulk", "offer_bulk"]

log = logging.getLogger("crane.worker")


class WorkerBulk:
    """One attachment's bulk area, its descriptor until sent, and the codec it serves."""

    def __init__(self, engine: Engine, fd: int, area: BulkArea) -> None:
        self._engine = engine
        self.fd = fd
        self.area = area

    def sent(self) -> None:
        """The guest has the descriptor: close ours and serve staged calls from the area."""
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self._engine.codec.bulk = self.area

    def end(self) -> None:
        """The attachment is over (called by the drain thread, the area's one user here)."""
        if self._engine.codec.bulk is self.area:
            self._engine.codec.bulk = None
        self.area.close_streams()
        self.area.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def offer_bulk(engine: Engine, alive: Callable[[], bool], cap: int = 0) -> WorkerBulk | None:
    """A bulk area for a guest that is attaching (``cap`` bytes per FIFO; 0: the default, or
    ``CRANE_RING_BULK_CAP`` in the worker's environment), or None (its copies then ride in
    the calls) with the reason logged."""
    cap = cap or int(os.environ.get("CRANE_RING_BULK_CAP", DEFAULT_BULK_CAP))
    why = bulk_available()
    if why:
        log.info("call ring without a bulk area: %s", why)
        return None
    try:
        fd = BulkArea.create(cap)
    except OSError as e:
        log.warning("call ring without a bulk area: %s", e)
        return None
    try:
        return WorkerBulk(engine, fd, BulkArea(fd, alive))
    except OSError as e:
        os.close(fd)
        log.warning("call ring without a bulk area: %s", e)
        return None
