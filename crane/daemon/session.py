"""One session as the daemon keeps it: its identity, device, window slot, worker and state."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crane.api.errors import ProtocolError
from crane.daemon.devices import Device
from crane.daemon.lifecycle import OPERATIONS, TRANSITIONS, SessionState
from crane.daemon.workers import WorkerProcess
from crane.device.layout import window_base
from crane.host.stats import SessionStats
from crane.state.session_record import SessionRecord
from crane.v1 import common_pb2

__all__ = ["DaemonSession", "Gone", "SessionMoved"]


class SessionMoved(ProtocolError):
    """The session migrated to another daemon: a resuming guest is redirected there."""

    def __init__(self, sid: str, to: str) -> None:
        super().__init__(
            "NOT_FOUND", f"session {sid} moved to {to}", trailers=(("crane-moved-to", to),)
        )
        self.to = to


@dataclass
class DaemonSession:
    id: str
    token: bytes
    device: Device
    slot: int
    worker: WorkerProcess
    identity: common_pb2.DeviceIdentity
    client: str
    stats: SessionStats
    stats_path: Path
    state: SessionState
    peer: str = ""
    direct_socket: Path | None = None
    #: The worker's own TCP port for remote guests (0: none; crane.daemon.worker_tcp).
    tcp_port: int = 0
    opened_at: float = field(default_factory=time.time)
    uuid_seed: str = ""
    #: Held by whoever talks on the worker channel (the relay, per batch; a checkpoint).
    channel_lock: threading.Lock = field(default_factory=threading.Lock)
    #: Worker frames a checkpoint read while the relay waited (async failures); relayed next.
    pending: list[bytes] = field(default_factory=list)
    parked_at: str = ""  # the checkpoint file of a parked session
    parked_since: float = 0.0  # time.monotonic() when it was parked
    #: Limits the guest was told at open (kept across moves: the pre-flight compares them).
    told: dict[int, int] = field(default_factory=dict)
    location: str = ""  # migrating: "-> ADDR" (crane ps)
    migration: dict[str, Any] = field(default_factory=dict)  # latest progress of a move out
    switching: bool = False  # migrating, and the guest is stopped for the switchover
    #: Presence streams its direct guest holds open (SessionManager.watch_guest).
    presences: int = 0
    #: The tenant whose caller opened the session (crane.daemon.callers.Caller.tenant: a
    #: TenantConfig name, or uid:N / cert:NAME without tenants); only that tenant's callers
    #: (and operators) may act on it. Kept in its record, so restores and migrations keep it.
    tenant: str = ""
    #: The libvirt domain whose guest opened the session ("": not a VM's), from the socket or
    #: certificate it came in by (crane.daemon.domains); kept in its record like the tenant.
    domain: str = ""
    #: The call stream attached now (a token of the Calls RPC that attached it; None: none):
    #: an old stream's end must not detach its successor.
    stream: object | None = None
    #: Set when a VM guest's stream broke (a marker the re-attach grace checks is unchanged).
    detached: object | None = None
    #: A VM guest's stream broke while the session ran: whoever closes it leaves the tombstone
    #: that tells the resuming guest why (SessionManager.stream_ended).
    broken: bool = False
    #: Ends the relay's call stream (the gRPC call's ``cancel``) once the session is over, so
    #: a guest that closed it without a synchronizing batch does not hold a daemon thread.
    end_stream: Callable[[], object] | None = None

    @property
    def va_base(self) -> int:
        return window_base(self.slot)

    def require(self, operation: str) -> None:
        """Refuse ``operation`` (a key of :data:`~crane.daemon.lifecycle.OPERATIONS`) unless
        the session is in a state that allows it."""
        allowed = OPERATIONS[operation]
        if self.state not in allowed:
            raise ProtocolError(
                "FAILED_PRECONDITION",
                f"session {self.id} is {self.state.value}; {operation} needs it "
                + " or ".join(s.value for s in SessionState if s in allowed),
            )

    def move(self, to: SessionState) -> None:
        """Enter ``to``; a transition :data:`~crane.daemon.lifecycle.TRANSITIONS` lacks is a
        bug in the daemon, never the client's doing."""
        if to is not self.state and to not in TRANSITIONS[self.state]:
            raise RuntimeError(f"session {self.id}: {self.state.value} -> {to.value}")
        self.state = to

    def record(self) -> SessionRecord:
        """The session as checkpoints and migrations carry it."""
        return SessionRecord(
            id=self.id,
            token=self.token,
            slot=self.slot,
            uuid_seed=self.uuid_seed,
            client=self.client,
            told=dict(self.told),
            device=self.identity,
            tenant=self.tenant,
            domain=self.domain,
        )

    def adopt(self, record: SessionRecord) -> None:
        """Answer with what the session's guest was told, not with this device."""
        if record.device is not None:
            self.identity = record.device
            self.told = dict(record.device.attributes)
        elif record.told:
            self.told = dict(record.told)


@dataclass
class Gone:
    """A session that left this daemon, remembered for a while: migrated away (``to`` is the
    daemon it went to), or parked and never restored (``why`` tells its guest)."""

    session: DaemonSession
    since: float  # time.monotonic() when it left
    to: str = ""
    why: str = ""
