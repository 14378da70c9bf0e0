"""The worker's side of one session: its engine, who is attached to it, and its lifecycle.

A guest reaches its worker either through the daemon's relay (batches arrive on the channel) or
directly, over the worker's own socket (:mod:`crane.worker.direct`). Exactly one call stream may
be attached at a time; the first one wins and the mode is fixed for the session's life.

Lifecycle (:class:`WorkerState`, transitions in :data:`TRANSITIONS`)::

    waiting ──► relay | direct ──► parked ──► ended
       │  └──────────────────────────┘   └─► ended
       └──► incoming ──► waiting                    (a migration arriving: rounds, then the guest)

``parked`` is final for calls: the session was checkpointed with release or migrated away, so
its state lives elsewhere and no call may run here again; the worker stays only until the
daemon has the answer and releases it. Each operation names the states it is allowed in
(:data:`ALLOWED`) and is refused by name otherwise.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum

from crane.engine.engine import Engine
from crane.host.stats import MODE_RELAY, SessionStats, SnapshotFile

__all__ = [
    "ALLOWED",
    "TRANSITIONS",
    "NotAllowed",
    "SessionParked",
    "TooLate",
    "WorkerSession",
    "WorkerState",
]

log = logging.getLogger("crane.worker")

#: How often the session's accounting snapshot is republished (seconds).
PUBLISH_S = 1.0


class WorkerState(Enum):
    WAITING = "waiting"  # no call stream yet
    INCOMING = "incoming"  # a migration's rounds are arriving; the guest comes after
    RELAY = "relay"  # the guest's calls come through the daemon
    DIRECT = "direct"  # the guest's calls come to the worker's own socket
    PARKED = "parked"  # checkpointed with release or migrated away: no call runs here again
    ENDED = "ended"  # the guest closed the session, or nobody attached in time


S = WorkerState
TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    S.WAITING: frozenset({S.RELAY, S.DIRECT, S.INCOMING, S.PARKED, S.ENDED}),
    S.INCOMING: frozenset({S.WAITING, S.ENDED}),
    S.RELAY: frozenset({S.PARKED, S.ENDED}),
    S.DIRECT: frozenset({S.PARKED, S.ENDED}),
    S.PARKED: frozenset({S.ENDED}),
    S.ENDED: frozenset(),
}

#: Which states each operation may run in.
ALLOWED: dict[str, frozenset[WorkerState]] = {
    "attach": frozenset({S.WAITING}),
    "run calls": frozenset({S.RELAY, S.DIRECT}),
    "checkpoint": frozenset({S.WAITING, S.RELAY, S.DIRECT}),
    "restore": frozenset({S.WAITING}),
    "migrate out": frozenset({S.WAITING, S.RELAY, S.DIRECT}),
    "receive a migration round": frozenset({S.WAITING, S.INCOMING}),
}


_RUNS = ALLOWED["run calls"]


class NotAllowed(Exception):
    """An operation refused in the session's current state (the message names both)."""


class TooLate(NotAllowed):
    """The session's call in progress did not return by an operation's deadline."""


class SessionParked(NotAllowed):
    """The session was checkpointed and released, or migrated away: no call may run here."""


class WorkerSession:
    def __init__(
        self,
        engine: Engine,
        session_id: str,
        stats: SessionStats,
        snapshots: SnapshotFile | None = None,
    ) -> None:
        self.engine = engine
        self.session_id = session_id
        self.stats = stats
        #: Where the accounting is published (None, or an engine without a meter: not).
        self.snapshots = snapshots if engine.meter is not None else None
        self._published = 0.0
        self.lock = threading.Lock()  # one batch at a time, whichever path it came from
        self.state = WorkerState.WAITING
        self.attached = threading.Event()  # a call stream attached (the abandon timer's cue)
        self.ended = threading.Event()
        #: time.monotonic() when the batch now running started (0: none runs).
        self.busy_since = 0.0

    # ---- the lifecycle ---------------------------------------------------------------------
    def require(self, operation: str) -> None:
        """Refuse ``operation`` unless the session is in a state that allows it."""
        allowed = ALLOWED[operation]
        if self.state not in allowed:
            why = (
                f"session {self.session_id} is {self.state.value}; {operation} needs it "
                + " or ".join(sorted(s.value for s in allowed))
            )
            raise SessionParked(why) if self.state is S.PARKED else NotAllowed(why)

    def move(self, to: WorkerState) -> None:
        """Enter ``to``; a transition the table lacks is a bug in the caller."""
        if to is not self.state and to not in TRANSITIONS[self.state]:
            raise RuntimeError(f"session {self.session_id}: {self.state.value} -> {to.value}")
        self.state = to

    @property
    def parked(self) -> bool:
        return self.state is S.PARKED

    @property
    def relay(self) -> bool:
        return self.state is S.RELAY

    def acquire_by(self, deadline: float, operation: str) -> None:
        """Take the batch lock by ``deadline`` (``time.monotonic()``; 0: wait as long as it
        takes), else refuse ``operation``: a call that does not return (a kernel spinning
        forever) must not hold the daemon's request, and the session's state, hostage."""
        timeout = -1.0 if deadline <= 0 else max(deadline - time.monotonic(), 0.0)
        if not self.lock.acquire(timeout=timeout):
            since = self.busy_since
            running = f" for {time.monotonic() - since:.1f} s" if since else ""
            raise TooLate(
                f"{operation} not started: a call batch has been running{running} (a kernel "
                "that does not finish?) and did not return by the deadline"
            )

    @contextmanager
    def boundary(self, wait_s: float, operation: str) -> Iterator[None]:
        """Hold the batch lock (a call boundary), waiting at most ``wait_s`` for it
        (:class:`TooLate` past that)."""
        self.acquire_by(time.monotonic() + wait_s, operation)
        try:
            yield
        finally:
            self.lock.release()

    # ---- calls -----------------------------------------------------------------------------
    def attach(self, mode: int, peer: str = "") -> bool:
        """Claim the session for a stream; False if another stream (or mode) holds it."""
        with self.lock:
            if self.state not in ALLOWED["attach"]:
                return False
            self.move(S.RELAY if mode == MODE_RELAY else S.DIRECT)  # direct: gRPC or ring
            # memory a migration handed over is this worker's alone once its guest is here
            # (the source let go: the guest was redirected, and an abort no longer lands)
            self.engine.device.claim_memory()
            self.stats.set_attached(mode, peer)
            self.attached.set()
            return True

    def run(self, raw: bytes) -> list[bytes]:
        """Execute one batch of the attached stream (:class:`SessionParked` once parked)."""
        with self.lock:
            if self.state not in _RUNS:  # (the table's answer, looked up once)
                self.require("run calls")
            self.busy_since = time.monotonic()
            try:
                msgs = self.engine.run_batch(raw)
            finally:
                self.busy_since = 0.0
            self.publish_stats()
            if self.snapshots is not None and time.monotonic() - self._published >= PUBLISH_S:
                self.publish_metrics()
            if self.engine.device.closed:
                self.move(S.ENDED)
            return msgs

    def publish_stats(self) -> None:
        """Tell ``crane ps`` where the session stands: after every batch, and after state that
        arrived another way (a restore, a migration's rounds) so that it is never shown as 0 B
        while the device holds its memory."""
        log = self.engine.log
        self.stats.write(log.calls, self.engine.device.mem_used(), log.done_seq)

    def publish_metrics(self) -> None:
        """Publish the accounting snapshot (the caller holds the batch lock: the meter is the
        batch thread's). A write that fails is logged and retried at the next occasion."""
        meter, snapshots = self.engine.meter, self.snapshots
        if meter is None or snapshots is None:
            return
        self._published = time.monotonic()
        try:
            self.engine.settle_work()
            snapshots.write(meter.snapshot())
        except OSError as e:
            log.warning("cannot publish the session's accounting to %s: %s", snapshots.path, e)

    def publish_while_idle(self, stop: threading.Event) -> None:
        """Republish every :data:`PUBLISH_S` while no batch runs (a thread's loop, until
        ``stop``): the profile's window moves on when the guest is idle, and the last batch's
        counts must not wait for a next batch. A batch running publishes at its end."""
        while not stop.wait(PUBLISH_S):
            if self.snapshots is None:
                return
            if time.monotonic() - self._published < PUBLISH_S / 2:
                continue
            if self.lock.acquire(blocking=False):
                try:
                    self.publish_metrics()
                finally:
                    self.lock.release()

    def end(self) -> None:
        """The session is over here (the guest closed it, or nobody attached in time)."""
        if self.state is not S.ENDED:
            self.move(S.ENDED)
        self.ended.set()
