"""A change counter that waiters block on: the daemon's board of migration progress.

A migration's watcher bumps it on every update; ``crane migrate``'s progress stream and a
guest's Resume waiting for a switchover wait on it instead of polling.
"""

from __future__ import annotations

import threading

__all__ = ["Changes"]


class Changes:
    """A counter bumped on every migration update, for waiters (progress streams, resumes)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.version = 0

    def bump(self) -> None:
        with self.cond:
            self.version += 1
            self.cond.notify_all()

    def wait(self, seen: int, timeout: float) -> int:
        """Block until the counter differs from ``seen`` (or ``timeout``); its value."""
        with self.cond:
            self.cond.wait_for(lambda: self.version != seen, timeout)
            return self.version
