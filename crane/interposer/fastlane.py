"""The Python half of the fast lane (interposer/src/fastlane.c): what this side teaches the
library's C after serving a call itself, and when it makes the C side forget.

The C side queues a call of an entry with a fast form (:data:`crane.api.driver_spec.FAST`) as a
packed record without entering Python, but only when the call matches what it was taught here:
a device range the session's checks accepted and a stream and event the session knows, while
no stream captures, no event holds a capture's frontier, nothing is mirrored and no sticky
fault stands (each of which needs this side's
path). Teaching happens after this side served such a call; forgetting whenever any of that may
stop holding (the session's :meth:`~crane.guest.session.GuestSession.on_forget` hooks, a capture
begun, a sticky fault). A teaching read the C side's generation before the call's checks, so
one that raced a forgetting is dropped there.

``CRANE_FAST=0`` keeps the lane off (every call the Python way), for comparisons.
"""

from __future__ import annotations

from typing import Any

from crane.api.ops import OPS_BY_NAME
from crane.guest.session import GuestSession

__all__ = ["FAST", "FastLane"]


class FastLane:
    """The process's fast lane (one, as the library is one)."""

    def __init__(self) -> None:
        self._lib: Any = None
        self._session: GuestSession | None = None

    def attach(self, lib: Any) -> None:
        self._lib = lib

    def gen(self) -> int:
        """Read before a call's checks; hand it to :meth:`learn` after the call."""
        return int(self._lib.crane_fast_gen()) if self._lib is not None else 0

    def learn(
        self,
        g: int,
        session: GuestSession,
        stream: int,
        dst: int = 0,
        size: int = 0,
        *,
        event: int = 0,
    ) -> None:
        """After this side served a call on ``stream`` over ``[dst, dst+size)`` (``size`` 0:
        none) or with ``event`` (0: none), all checked: let the C side take calls within the
        same allocation, stream and event."""
        lib = self._lib
        if lib is None or session.mirrors.mirrored:
            return
        if self._session is not session:
            handles = session.queue_handles()
            if handles is None:  # a Python queue (the C one not built): nothing to hand over
                return
            self._session = session
            session.on_forget(self.forget)
            q, put, cap = handles
            ops = ("MEMSET", "EVENT_RECORD", "STREAM_WAIT_EVENT", "MEMCPY_DTOD")
            ids = (OPS_BY_NAME[n].id for n in ops)
            lib.crane_fast_arm(q, put, cap, *ids)
        start = end = 0
        if size:
            hit = session.va.lookup(dst)
            if hit and dst + size <= hit[0] + hit[1]:
                start, end = hit[0], hit[0] + hit[1]
        lib.crane_fast_learn(g, start, end, stream, event)

    def forget(self) -> None:
        if self._lib is not None:
            self._lib.crane_fast_forget()


FAST = FastLane()
