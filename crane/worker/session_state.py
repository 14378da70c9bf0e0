"""The worker's side of one session: the engine plus who is attached to it.

A guest reaches its worker either through the daemon's relay (batches arrive on the channel) or
directly, over the worker's own socket (:mod:`crane.worker.direct`). Exactly one call stream may
be attached at a time; the first one wins and the mode is fixed for the session's life.
"""

from __future__ import annotations

import threading

from crane.engine.engine import Engine
from crane.worker.stats import MODE_RELAY, SessionStats

__all__ = ["SessionParked", "WorkerSession"]


class SessionParked(Exception):
    """The session was checkpointed and released: no call may run here any more."""


class WorkerSession:
    def __init__(self, engine: Engine, session_id: str, stats: SessionStats) -> None:
        self.engine = engine
        self.session_id = session_id
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
                raise SessionParked(self.session_id)
            msgs = self.engine.run_batch(raw)
            log = self.engine.log
            self.stats.write(log.calls, self.engine.device.mem_used(), log.done_seq)
            return msgs

    @property
    def relay(self) -> bool:
        return self.mode == MODE_RELAY
