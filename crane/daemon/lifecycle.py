"""The daemon's session lifecycle: states, the transitions between them, and what each allows.

::

    ready ──► running ──► closing ──► closed
      └────────────────────────┘ (guest never attached / disconnected)

    ready/running ──► checkpointing ──► ready/running      (Checkpoint)
                                   └──► parked             (Checkpoint with release: the worker
                                                            and its device memory are gone; the
                                                            entry keeps the id, token and window)
    parked ──► restoring ──► ready                         (Restore on this daemon)
         └──► closed                                       (parked_ttl_s passed: expired)
    restoring ──► ready                                    (Restore of another daemon's session)
    ready/running ──► migrating ──► migrated               (live migration out: crane.migrate;
                               └──► ready/running           a tombstone redirects Resume)
    incoming ──► ready                                     (migration in, at the final ack)

Every change of state goes through :meth:`DaemonSession.move` and :data:`TRANSITIONS`; every
operation is listed in :data:`OPERATIONS` with the states it may run in, and is refused by name
otherwise (so a second stream on a session, or a stream on a closing one, gets a clear error
rather than a race). The sets below name the other questions the daemon asks of a state, once.
"""

from __future__ import annotations

from enum import Enum

__all__ = [
    "AWAY",
    "ENDS_NOTHING",
    "OPERATIONS",
    "RETRY_LATER",
    "TRANSITIONS",
    "WORKER_MAY_EXIT",
    "SessionState",
]


class SessionState(Enum):
    READY = "ready"  # opened, no call stream yet
    RUNNING = "running"  # a call stream is attached through the daemon's relay
    CHECKPOINTING = "checkpointing"
    PARKED = "parked"  # checkpointed and released: only the entry is left, for a restore
    RESTORING = "restoring"
    MIGRATING = "migrating"  # moving to another daemon; still served here until switchover
    MIGRATED = "migrated"  # moved away: a tombstone that redirects the guest
    INCOMING = "incoming"  # arriving by migration; not in the table until the final round
    CLOSING = "closing"
    CLOSED = "closed"


S = SessionState

TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    S.READY: frozenset({S.RUNNING, S.CHECKPOINTING, S.MIGRATING, S.CLOSING}),
    S.RUNNING: frozenset({S.CHECKPOINTING, S.MIGRATING, S.CLOSING}),
    S.CHECKPOINTING: frozenset({S.READY, S.RUNNING, S.PARKED, S.CLOSING}),
    S.PARKED: frozenset({S.RESTORING, S.CLOSED}),
    S.RESTORING: frozenset({S.READY, S.PARKED}),
    S.MIGRATING: frozenset({S.MIGRATED, S.READY, S.RUNNING, S.CLOSING}),
    S.MIGRATED: frozenset(),
    S.INCOMING: frozenset({S.READY}),
    S.CLOSING: frozenset({S.CLOSED}),
    S.CLOSED: frozenset(),
}

#: The states each operation may start in.
OPERATIONS: dict[str, frozenset[SessionState]] = {
    "attach a call stream": frozenset({S.READY}),
    "resume": frozenset({S.READY, S.RUNNING}),
    "checkpoint": frozenset({S.READY, S.RUNNING}),
    "migrate": frozenset({S.READY, S.RUNNING}),
    "restore": frozenset({S.PARKED}),
}

#: A resuming guest is told to retry: its session is away for a moment, or parked.
RETRY_LATER = frozenset({S.PARKED, S.RESTORING, S.CHECKPOINTING, S.MIGRATING, S.INCOMING})

#: Closing is a no-op: nothing of the session runs here (a stream ending is what parking or
#: moving causes, so it does not close the entry).
ENDS_NOTHING = frozenset({S.CLOSING, S.CLOSED, S.PARKED, S.RESTORING, S.MIGRATED})

#: The worker exiting is expected (someone else decides what happens to the entry).
WORKER_MAY_EXIT = frozenset(
    {S.CLOSING, S.CLOSED, S.CHECKPOINTING, S.PARKED, S.RESTORING, S.MIGRATING, S.MIGRATED}
)

#: The relayed stream broke because the session left or is leaving: the guest is told it is
#: parked (and resumes) rather than that its worker died.
AWAY = frozenset({S.PARKED, S.CHECKPOINTING, S.MIGRATING, S.MIGRATED})
