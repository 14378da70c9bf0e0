"""Entries of sessions that left do not stay forever: the expiry and its sweeper.

A parked entry not restored within ``parked_ttl_s`` is dropped, freeing its slot and window, and
its waiting guest is answered NOT_FOUND with the reason at its next Resume (it stops waiting and
fails its call); a migrated entry redirects its guest for ``moved_ttl_s``. ``crane ps`` lists
both until then. A sweeper thread runs :meth:`Expiry.expire` periodically, and the session
manager runs it on access, so an entry never outlives its time by more than a sweep.
"""

from __future__ import annotations

import logging
import threading
import time

from crane.daemon.lifecycle import SessionState
from crane.daemon.registry import SessionTable
from crane.daemon.session import DaemonSession, Gone
from crane.host.logs import about

__all__ = ["Expiry", "age"]

log = logging.getLogger("craned")


def age(seconds: float) -> str:
    """A duration as ``crane ps`` and log lines write it."""
    seconds = max(int(seconds), 0)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


class Expiry:
    def __init__(self, table: SessionTable, moved_ttl_s: float, parked_ttl_s: float) -> None:
        self.table = table
        self.moved_ttl_s = moved_ttl_s  # 0: keep forever
        self.parked_ttl_s = parked_ttl_s  # 0: keep until restored
        self._stop = threading.Event()
        ttls = [t for t in (moved_ttl_s, parked_ttl_s) if t > 0]
        if ttls:
            period = min(max(min(ttls) / 10, 0.05), 5.0)
            threading.Thread(
                target=self._sweep, args=(period,), name="session-expiry", daemon=True
            ).start()

    def stop(self) -> None:
        self._stop.set()

    def expire(self, now: float | None = None) -> None:
        """Drop parked entries older than ``parked_ttl_s`` (their guests are told why at their
        next Resume) and redirects older than ``moved_ttl_s``."""
        now = time.monotonic() if now is None else now
        dropped: list[DaemonSession] = []
        forgotten: list[Gone] = []
        t = self.table
        with t.lock:
            if self.parked_ttl_s > 0:
                for s in list(t.entries().values()):
                    if s.state is SessionState.PARKED and now - s.parked_since >= self.parked_ttl_s:
                        t.remove(s)
                        s.move(SessionState.CLOSED)
                        why = (
                            f"session {s.id} expired on this daemon: it was parked to "
                            f"{s.parked_at} {age(now - s.parked_since)} ago and not restored "
                            f"within parked_ttl_s={self.parked_ttl_s:g} s"
                        )
                        t.expired[s.id] = Gone(s, now, why=why)
                        dropped.append(s)
            if self.moved_ttl_s > 0:
                for tombstones in (t.moved, t.expired):
                    for sid, g in list(tombstones.items()):
                        if now - g.since >= self.moved_ttl_s:
                            del tombstones[sid]
                            if g.to:
                                forgotten.append(g)
        for s in dropped:
            with about(s):
                self._dropped(s, now)
        for g in forgotten:
            with about(g.session):
                log.info(
                    "session %s: forgot its redirect to %s (moved_ttl_s=%g s)",
                    g.session.id,
                    g.to,
                    self.moved_ttl_s,
                )

    def _dropped(self, s: DaemonSession, now: float) -> None:
        log.warning(
            "session %s: parked to %s %s ago and not restored within parked_ttl_s=%g s; "
            "its entry expired (slot %d freed); a guest still waiting is told at its next "
            "resume and its call fails (CUDA_ERROR_NO_DEVICE); the checkpoint file is kept",
            s.id,
            s.parked_at,
            age(now - s.parked_since),
            self.parked_ttl_s,
            s.slot,
        )

    def _sweep(self, period: float) -> None:
        while not self._stop.wait(period):
            try:
                self.expire()
            except Exception:  # never let a bug end the sweeper silently
                log.exception("session expiry sweep failed")
