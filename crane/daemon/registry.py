"""The daemon's table of sessions and VA window slots, and the entries of sessions that left.

One lock guards it all, so that "is this slot free", "is this session here" and "take it" are
one step. A slot is held while a session is on its way in, before it joins the table (a new
one: :meth:`SessionTable.reserve` picks a free slot; a restored or migrating one claims the slot
its record names, after :meth:`SessionTable.slot_refusals` found it free), so two arrivals
never get one window.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from crane.api.errors import ProtocolError
from crane.daemon.lifecycle import SessionState
from crane.daemon.session import DaemonSession, Gone
from crane.device.layout import WINDOW_SLOTS, window_base

__all__ = ["SLOT_GRACE_S", "SessionTable"]

#: How long a restore or an arriving migration waits for its window's holder to leave.
SLOT_GRACE_S = 2.0


class SessionTable:
    def __init__(self, max_sessions: int, tenant_max: dict[str, int] | None = None) -> None:
        self.max_sessions = min(max_sessions, WINDOW_SLOTS)
        #: Tenant -> the most sessions it may hold here (tenants without a limit are absent).
        self.tenant_max = dict(tenant_max or {})
        self.lock = threading.Lock()
        self._sessions: dict[str, DaemonSession] = {}
        self._starting: set[int] = set()  # window slots of sessions being opened or arriving
        self._starting_tenant: dict[int, str] = {}  # their tenants
        #: Sessions migrated away, for Resume redirects and ``crane ps`` (until moved_ttl_s).
        self.moved: dict[str, Gone] = {}
        #: Parked sessions whose entry expired: their guest's Resume is told why.
        self.expired: dict[str, Gone] = {}

    # ---- lookups (take the lock) ---------------------------------------------------------------
    def get(self, sid: str) -> DaemonSession:
        session = self.find(sid)
        if session is None:
            raise ProtocolError("NOT_FOUND", f"no session {sid!r} on this daemon")
        return session

    def find(self, sid: str) -> DaemonSession | None:
        with self.lock:
            return self._sessions.get(sid)

    def sessions(self) -> list[DaemonSession]:
        with self.lock:
            return list(self._sessions.values())

    def gone(self, sid: str) -> Gone | None:
        """The tombstone of a session that left (moved away, or expired while parked)."""
        with self.lock:
            if sid in self._sessions:
                return None
            return self.moved.get(sid) or self.expired.get(sid)

    # ---- with the lock held ----------------------------------------------------------------------
    def entries(self) -> dict[str, DaemonSession]:
        """The live table itself (hold :attr:`lock` while using it)."""
        return self._sessions

    def slot_refusals(self, sid: str, slot: int) -> list[tuple[str, str]]:
        """Why session ``sid`` cannot take window ``slot`` here, each reason with the gRPC
        status it deserves (hold :attr:`lock`)."""
        out: list[tuple[str, str]] = []
        here = self._sessions.get(sid)
        if here is not None and here.state is not SessionState.PARKED:
            out.append(
                ("ALREADY_EXISTS", f"session {sid} is already {here.state.value} on this daemon")
            )
        if not 0 <= slot < WINDOW_SLOTS:
            return [*out, ("INVALID_ARGUMENT", f"VA window slot {slot} out of range")]
        for other in self._sessions.values():
            if other.slot == slot and other is not here:
                out.append(
                    (
                        "FAILED_PRECONDITION",
                        f"VA window slot {slot} ({window_base(slot):#x}) that session {sid} "
                        f"needs is taken by session {other.id} on this daemon",
                    )
                )
        if slot in self._starting:
            out.append(
                ("FAILED_PRECONDITION", f"VA window slot {slot} is being opened on this daemon")
            )
        return out

    def settle_slot(self, sid: str, slot: int, grace_s: float = SLOT_GRACE_S) -> None:
        """Wait up to ``grace_s`` for another session holding ``slot`` to leave (do not hold
        :attr:`lock`).

        A guest's close reaches its worker, not the daemon: the session leaves this table when
        the reaper sees the worker exit, a moment after the guest was answered. A restore or an
        arriving migration that needs the window of a session its guest has just closed waits
        for that instead of being refused; a holder that stays is refused after the grace."""
        deadline = time.monotonic() + grace_s
        while True:
            with self.lock:
                held = any(o.slot == slot and o.id != sid for o in self._sessions.values()) or (
                    slot in self._starting
                )
            if not held or time.monotonic() >= deadline:
                return
            time.sleep(0.02)

    def full(self, sid: str | None = None) -> bool:
        """No room for one more session (``sid``'s own parked entry would be reused)."""
        if sid is not None and sid in self._sessions:
            return False
        return len(self._sessions) + len(self._starting) >= self.max_sessions

    def tenant_refusal(self, tenant: str, sid: str | None = None) -> str:
        """Why ``tenant`` cannot have one more session here ("" when it can; ``sid``'s own
        parked entry would be reused). Parked sessions count: each holds a session slot."""
        most = self.tenant_max.get(tenant)
        if most is None or (sid is not None and sid in self._sessions):
            return ""
        if self.tenant_sessions(tenant) < most:
            return ""
        return f"tenant {tenant} is at its limit of {most} sessions"

    def tenant_sessions(self, tenant: str) -> int:
        """Sessions of ``tenant`` here: in the table (parked ones too) or on their way in
        (hold :attr:`lock`)."""
        held = sum(1 for s in self._sessions.values() if s.tenant == tenant)
        return held + sum(1 for t in self._starting_tenant.values() if t == tenant)

    def claim_slot(self, slot: int, tenant: str = "") -> None:
        self._starting.add(slot)
        self._starting_tenant[slot] = tenant

    def unclaim_slot(self, slot: int) -> None:
        self._starting.discard(slot)
        self._starting_tenant.pop(slot, None)

    def add(self, session: DaemonSession) -> None:
        self._sessions[session.id] = session
        self.moved.pop(session.id, None)
        self.expired.pop(session.id, None)

    def remove(self, session: DaemonSession) -> None:
        if self._sessions.get(session.id) is session:
            del self._sessions[session.id]

    def remember_moved(self, session: DaemonSession, to: str) -> None:
        """The session now lives on ``to``: keep a redirect for its guest, and a ``crane ps``
        line, until the expiry drops it."""
        self.remove(session)
        self.moved[session.id] = Gone(session, time.monotonic(), to=to)
        self.expired.pop(session.id, None)

    # ---- slots ---------------------------------------------------------------------------------
    @contextmanager
    def reserve(self, tenant: str = "") -> Iterator[int]:
        """A random free window slot, held for a new session of ``tenant`` until it joins the
        table (RESOURCE_EXHAUSTED when the daemon or the tenant is at its limit)."""
        with self.lock:
            used = {s.slot for s in self._sessions.values()} | self._starting
            free = [i for i in range(WINDOW_SLOTS) if i not in used]
            if self.full() or not free:
                raise ProtocolError(
                    "RESOURCE_EXHAUSTED", f"daemon is at its limit of {self.max_sessions} sessions"
                )
            why = self.tenant_refusal(tenant)
            if why:
                raise ProtocolError("RESOURCE_EXHAUSTED", why)
            slot = random.choice(free)
            self.claim_slot(slot, tenant)
        try:
            yield slot
        finally:
            with self.lock:
                self.unclaim_slot(slot)
