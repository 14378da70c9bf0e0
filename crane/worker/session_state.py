"""The worker's side of one session: the executor plus who is attached to it.

A guest reaches its worker either through the daemon's relay (batches arrive on the channel) or
directly, over the worker's own socket (:mod:`crane.worker.direct`). Exactly one call stream may
be attached at a time; the first one wins and the mode is fixed for the session's life.
"""

from __future__ import annotations

import threading

from crane.worker.executor import Executor
from crane.worker.stats import MODE_RELAY, SessionStats

__all__ = ["SessionParked", "WorkerSession"]


class SessionParked(Exception):
    """The session was checkpointed and released: no call may run here any more."""


class WorkerSession:
    def __init__(self, executor: Executor, stats: SessionStats) -> None:
        self.executor = executor
        self.stats = stats
        self.lock = threading.Lock()  # one batch at a time, whichever path it came from
        self.mode = 0
        self.attached = threading.Event()
        self.ended = threading.Event()
        self.parked = False  # set under the lock by a releasing checkpoint

    def attach(self, mode: int, peer: str = "") -> bool:
        """Claim the session for a stream; False if another stream (or mode) holds it."""
        with self.lock:
            if self.mode != 0:
                return False
            self.mode = mode
            self.stats.set_attached(mode, peer)
            self.attached.set()
            return True

    def run(self, raw: bytes) -> list[bytes]:
        with self.lock:
            if self.parked:
                raise SessionParked(self.executor.session_id)
            msgs = self.executor.run_batch(raw)
            ex = self.executor
            self.stats.write(ex.calls, ex.mem_used(), ex.done_seq)
            return msgs

    @property
    def relay(self) -> bool:
        return self.mode == MODE_RELAY
