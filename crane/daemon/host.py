"""What the daemon offers live migration: the interface ``crane.migrate`` works through.

Migration needs a daemon's sessions on both ends (claim one to move it out, start a worker for
one moving in, admit it at the switchover, release a worker, leave a redirect behind), but not
how the daemon keeps them. :class:`SessionHost` names that surface; the daemon's
:class:`~crane.daemon.sessions.SessionManager` implements it, and the composition root
(``crane.craned.server``) hands the one to the other. Dependencies point one way: migration
imports this interface, the daemon never imports migration.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from crane.daemon.changes import Changes
from crane.daemon.devices import Device
from crane.daemon.lifecycle import SessionState
from crane.daemon.registry import SessionTable
from crane.daemon.session import DaemonSession
from crane.modules.store import ImageStore
from crane.state.session_record import SessionRecord
from crane.wire.channel import TlsFiles

__all__ = ["SessionHost"]


class SessionHost(Protocol):
    devices: list[Device]
    images: ImageStore
    table: SessionTable
    changes: Changes
    #: What this daemon presents to another one it migrates a session to (its certificate and
    #: key; the CA that signs peers' certificates).
    peer_tls: TlsFiles

    def device(self, index: int) -> Device: ...

    def get(self, sid: str) -> DaemonSession: ...

    def claim(
        self, sid: str, operation: str, to: SessionState
    ) -> tuple[DaemonSession, SessionState]: ...

    def give_back(
        self, session: DaemonSession, during: SessionState, before: SessionState
    ) -> None: ...

    def publish(
        self,
        session: DaemonSession,
        progress: dict[str, Any],
        switching: bool,
        fresh: bool = False,
    ) -> None: ...

    def moved_away(self, session: DaemonSession, to: str) -> threading.Event: ...

    def start(
        self,
        record: SessionRecord,
        device: Device,
        state: SessionState,
        replenish: bool = True,
        owner_uid: int = -1,
    ) -> DaemonSession: ...

    def admit(self, session: DaemonSession) -> None: ...

    def replenish_workers(self) -> None:
        """Top the pre-spawned workers up (after a :meth:`start` with ``replenish=False``)."""

    def release(
        self, session: DaemonSession, marked: threading.Event | None = None
    ) -> int | None: ...

    def wait_released(self, sid: str, timeout: float = 30.0) -> None: ...

    def close(self, session: DaemonSession, why: str) -> None: ...

    def worker_died(self, session: DaemonSession) -> None: ...
