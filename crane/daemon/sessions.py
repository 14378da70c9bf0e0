"""The daemon's sessions: opening, attaching, closing, and the surface the rest of craned uses.

Who is connected, on which device, in which VA window, served by which worker. Each session
moves through the lifecycle of :mod:`crane.daemon.lifecycle` (every change through
:meth:`DaemonSession.move`, every operation refused by name in a state that forbids it). The
other jobs live beside this module: the table and window slots (:mod:`~crane.daemon.registry`),
talking to workers (:mod:`~crane.daemon.worker_control`), checkpoint and restore
(:mod:`~crane.daemon.checkpoints`), expiry of entries that left
(:mod:`~crane.daemon.expiry`) and what ``crane ps`` shows (:mod:`~crane.daemon.render`).

:class:`SessionManager` is also the interface live migration works through
(:class:`crane.daemon.host.SessionHost`): it starts and admits sessions, claims them for an
operation, releases their workers, and keeps the progress board a guest's Resume waits on
during a switchover.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from crane.api.errors import ProtocolError
from crane.daemon import checkpoints
from crane.daemon.accounting import Accounting
from crane.daemon.callers import Caller, may_use
from crane.daemon.changes import Changes
from crane.daemon.devices import Device
from crane.daemon.expiry import Expiry
from crane.daemon.lifecycle import (
    ENDS_NOTHING,
    RETRY_LATER,
    WORKER_MAY_EXIT,
    SessionState,
)
from crane.daemon.quotas import Quotas
from crane.daemon.registry import SessionTable
from crane.daemon.session import DaemonSession, Gone, SessionMoved
from crane.daemon.tenants import TenantConfig
from crane.daemon.worker_control import configure
from crane.daemon.worker_tcp import WorkerTcp
from crane.daemon.workers import WorkerPool
from crane.device.layout import WINDOW_SIZE
from crane.device.model_file import model_to_dict
from crane.host.checkpoint_dir import CheckpointDir
from crane.host.lifeline import alive
from crane.host.logs import about, bind_session
from crane.host.messages import WorkerConfig
from crane.host.stats import WORKER_MODES, SessionStats, SnapshotFile, snapshot_path
from crane.modules.store import ImageStore
from crane.state.session_record import SessionRecord
from crane.wire.channel import TlsFiles
from crane.wire.ring import ring_socket_path

__all__ = ["SWITCHOVER_WAIT_S", "SessionManager"]

log = logging.getLogger("craned")

#: Longest a guest's Resume waits for a switchover in progress before it is told to retry.
SWITCHOVER_WAIT_S = 10.0
#: How often a waiter looks again without being woken.
_POLL_S = 0.05
#: How often a guest's presence watch looks whether its worker is still the session's.
_PRESENCE_POLL_S = 0.5
#: How long a VM guest's session waits for its guest after its connection broke (a VM's
#: connections reset when it migrates, or when its vsock bridge restarts) before it is closed.
DOMAIN_REATTACH_GRACE_S = 60.0
#: The migration phases that end one (crane.migrate.phases.Phase, a layer above: by value).
_MIGRATION_OVER = ("done", "failed")


class SessionManager:
    def __init__(
        self,
        devices: list[Device],
        run_dir: Path,
        pool: WorkerPool,
        max_sessions: int,
        attach_timeout_s: float = 60.0,
        moved_ttl_s: float = 600.0,
        parked_ttl_s: float = 3600.0,
        tenants: dict[str, TenantConfig] | None = None,
        peer_tls: TlsFiles | None = None,
        checkpoint_dir: Path | None = None,
        module_cache_bytes: int = 0,
        accounting: bool = True,
        profile_window_s: float = 60.0,
        call_ring: bool = True,
    ) -> None:
        """``checkpoint_dir``: the only directory checkpoints are written to and read from
        (None: ``run_dir/checkpoints``), created 0700. ``accounting``: workers count and time
        calls and GPU work (crane.engine.meter), over a profile window of
        ``profile_window_s``."""
        self.accounting = accounting
        self.profile_window_s = profile_window_s
        self.call_ring = call_ring  # offer guests on this host the shared-memory call ring
        #: What outlives the workers: ended sessions' counts, checkpoints, migrations.
        self.book = Accounting()
        self.attach_timeout_s = attach_timeout_s
        self.peer_tls = peer_tls or TlsFiles()
        self.checkpoints = CheckpointDir(checkpoint_dir or run_dir / "checkpoints")
        self.checkpoints.ensure()
        self.devices = devices
        self.run_dir = run_dir
        self.pool = pool
        self.quotas = Quotas(tenants or {}, run_dir)
        self.table = SessionTable(max_sessions, self.quotas.max_sessions())
        self.images = ImageStore(run_dir / "modules", module_cache_bytes)
        self.images.root.mkdir(parents=True, exist_ok=True)
        self.images.reset()  # no worker of a previous run pins anything
        (run_dir / "sessions").mkdir(parents=True, exist_ok=True)
        _clear_stale(run_dir / "sessions")
        #: Bumped on every migration update (crane.migrate.daemon_side publishes them).
        self.changes = Changes()
        self._releasing: dict[str, threading.Event] = {}  # sid -> set once its worker is gone
        self._releasing_lock = threading.Lock()
        self.expiry = Expiry(self.table, moved_ttl_s, parked_ttl_s)
        #: Workers' own TCP endpoints for remote guests (None: remote guests use the relay);
        #: set by craned once its tcp listener is bound (crane.daemon.worker_tcp).
        self.worker_tcp: WorkerTcp | None = None

    @property
    def max_sessions(self) -> int:
        return self.table.max_sessions

    def device(self, index: int) -> Device:
        """Device ``index`` (negative: the first); INVALID_ARGUMENT when there is none."""
        index = max(index, 0)
        if index >= len(self.devices):
            raise ProtocolError(
                "INVALID_ARGUMENT",
                f"no device {index}: this daemon serves {len(self.devices)} device(s)",
            )
        return self.devices[index]

    # ---- opening and starting ------------------------------------------------------------------
    def open(self, device_index: int, client: str, caller: Caller) -> DaemonSession:
        """A new session for ``caller``, bound to its tenant (whose quotas apply:
        RESOURCE_EXHAUSTED past its ``max_sessions``)."""
        device = self.device(device_index)
        self.expire()
        with self.table.reserve(caller.tenant) as slot:
            record = SessionRecord(
                id=uuid.uuid4().hex[:12],
                token=secrets.token_bytes(16),
                slot=slot,
                uuid_seed=secrets.token_hex(16),
                client=client,
                tenant=caller.tenant,
                domain=caller.domain,
            )
            bind_session(record)  # this call's log lines are about the new session
            owner = -1 if caller.uid is None else caller.uid
            session = self.start(record, device, SessionState.READY, owner_uid=owner)
            with self.table.lock:
                self.table.add(session)
            self.watch(session)
        log.info(
            "session %s opened on device %d (%s) for %s, %s, window %#x, worker pid %d",
            session.id,
            device.index,
            device.name,
            client or "?",
            caller,
            session.va_base,
            session.worker.pid,
        )
        return session

    def start(
        self,
        record: SessionRecord,
        device: Device,
        state: SessionState,
        replenish: bool = True,
        owner_uid: int = -1,
    ) -> DaemonSession:
        """A worker serving ``record``'s session on ``device`` (not yet in the table).
        ``replenish=False``: the caller replenishes the pool once its time-critical work is
        done (see :meth:`WorkerPool.take`). ``owner_uid``: the local user whose guest may
        reach the worker's socket (-1: only the daemon's user; others use the relay)."""
        sid = record.id
        bind_session(record)  # an open, a restore or an arrival: the call is about it now
        # a record without a seed (format 1 checkpoints) gets a fresh virtual device identity
        uuid_seed = record.uuid_seed or secrets.token_hex(16)
        stats_path = self.run_dir / "sessions" / f"{sid}.stats"
        direct: Path | None = self.run_dir / "sessions" / f"{sid}.sock"
        if len(str(direct)) > 100:  # AF_UNIX paths are limited to 108 bytes
            log.warning("session %s: run dir too deep for a direct socket; relay only", sid)
            direct = None
        # a VM's session keeps the relay (crane.daemon.worker_tcp): no port for it
        ports = None if record.domain else self.worker_tcp
        tcp_port = ports.allocate() if ports is not None else 0
        tcp = ports.worker_fields(tcp_port) if ports is not None and tcp_port else {}
        cfg = WorkerConfig(
            session_id=sid,
            backend=device.backend,
            device_arg=device.arg,
            va_base=record.va_base,
            va_size=WINDOW_SIZE,
            uuid_seed=uuid_seed,
            ledger_path=device.ledger_path,
            ledger_slot=record.slot,
            module_cache=str(self.images.root),
            stats_path=str(stats_path),
            token=record.token.hex(),
            direct_socket=str(direct) if direct else "",
            direct_uid=owner_uid,
            attach_timeout_s=self.attach_timeout_s,
            **self.quotas.worker_fields(record.tenant),
            domain=record.domain,
            module_cache_bytes=self.images.limit,
            model=model_to_dict(device.model) if device.model is not None else {},
            accounting=self.accounting,
            profile_window_s=self.profile_window_s,
            call_ring=self.call_ring,
            **tcp,
        )
        # the slot's tenant is known to the ledger before the worker can charge anything
        self.quotas.assign(record.slot, record.tenant)
        try:
            worker = self.pool.take(replenish)
            identity = configure(worker, cfg)
        except BaseException:
            self._free_port(tcp_port)
            raise
        return DaemonSession(
            id=sid,
            token=record.token,
            device=device,
            slot=record.slot,
            worker=worker,
            identity=identity,
            client=record.client,
            stats=SessionStats(stats_path),
            stats_path=stats_path,
            state=state,
            direct_socket=direct,
            tcp_port=tcp_port,
            uuid_seed=uuid_seed,
            told=dict(identity.attributes),
            tenant=record.tenant,
            domain=record.domain,
        )

    def admit(self, session: DaemonSession) -> None:
        """A restored or arriving session joins the table, ready for its guest (ALREADY_EXISTS
        when another session of that id got here first)."""
        with self.table.lock:
            old = self.table.entries().get(session.id)  # its parked entry, if it had one here
            # (or itself: a held migration's arrival waits in the table, incoming, till its commit)
            if (
                old is not None
                and old is not session
                and old.state
                not in (
                    SessionState.PARKED,
                    SessionState.RESTORING,
                )
            ):
                raise ProtocolError("ALREADY_EXISTS", f"session {session.id} appeared here")
            session.move(SessionState.READY)
            self.table.add(session)
        self.watch(session)

    def watch(self, session: DaemonSession) -> None:
        threading.Thread(
            target=self._reap, args=(session,), name=f"reap-{session.id}", daemon=True
        ).start()

    def _reap(self, session: DaemonSession) -> None:
        """A worker ends its session by exiting (guest gone, attach timeout, crash)."""
        code = session.worker.proc.wait()
        with about(session):
            self._reaped(session, code)

    def _reaped(self, session: DaemonSession, code: int) -> None:
        if session.state not in WORKER_MAY_EXIT:
            if code:
                log.error("session %s: worker exited with status %s", session.id, code)
                self.worker_died(session)
            self.close(session, "worker exited")

    def worker_died(self, session: DaemonSession) -> None:
        """Remember that ``session`` ended because its worker died, so that its guest's Resume
        hears why (the same answer as before the reaping) until moved_ttl_s, whichever of the
        reaper and the relay noticed first."""
        with self.table.lock:
            if self.table.entries().get(session.id) in (session, None):
                why = worker_exited(session.id)
                self.table.expired[session.id] = Gone(session, time.monotonic(), why=why)

    # ---- the guest's stream --------------------------------------------------------------------
    def attach(
        self,
        sid: str | None,
        token: bytes | None,
        peer: str,
        caller: Caller,
        stream: object | None = None,
    ) -> DaemonSession:
        """Bind the guest's call stream (``stream``: its token, for :meth:`stream_ended`) to
        its session (one stream at a time)."""
        with self.table.lock:
            session = self.table.entries().get(sid or "")
            if session is None:
                raise ProtocolError("NOT_FOUND", f"no session {sid!r} on this daemon")
            bind_session(session)
            _entitled(session, token, caller)
            session.require("attach a call stream")
            if session.stats.read()[3] in WORKER_MODES:
                raise ProtocolError(
                    "FAILED_PRECONDITION", f"session {sid} is attached directly to its worker"
                )
            session.move(SessionState.RUNNING)
            session.peer = peer
            session.stream = stream
            session.detached = None
        return session

    def stream_ended(self, session: DaemonSession, stream: object, clean: bool) -> None:
        """The call stream ``stream`` of ``session`` ended: ``clean`` (the guest closed it)
        or not (cancelled, or its connection broke). Ends the session, but one case: a VM
        guest's connection that broke while the session is migrating or being checkpointed.
        A VM's connections reset when the VM migrates, and the source VM stops (its forward's
        connections close) when libvirt is done with it, which may be before the session's own
        switchover is: the session's move goes on, and if it gives up the session waits, ready,
        for its guest to come back by token for :data:`DOMAIN_REATTACH_GRACE_S`."""
        away = (SessionState.MIGRATING, SessionState.CHECKPOINTING)
        with self.table.lock:
            keep = not clean and bool(session.domain) and session.state in away
            if keep and session.stream is stream:
                session.stream = None
                marker = session.detached = object()
            elif keep:
                return  # a later stream took over, or this one's end was handled already
        if not keep:
            if not clean and session.domain:
                # said before closing: the two ends of a stream (this, the RPC's callback) race,
                # and whichever closes the session must leave the tombstone
                with self.table.lock:
                    session.broken = True
            self.close(session, "stream ended")
            if not clean and session.domain:
                self._remember_broken(session)
            return
        log.info(
            "session %s: domain %s's connection broke while it is %s; it goes on without",
            session.id,
            session.domain,
            session.state.value,
        )
        self._await_guest(session, marker)

    def _remember_broken(self, session: DaemonSession) -> None:
        """A VM guest's session ended with its connection: its guest, which resumes at the one
        address it has (and would wait there for a session that is not coming), is told why.
        Called by whoever saw the break, and by :meth:`_close` for a session marked ``broken``
        (the other end of the stream may be the one closing it)."""
        with self.table.lock:
            if session.state is SessionState.CLOSED:
                self._broken_tombstone(session)

    def _broken_tombstone(self, session: DaemonSession) -> None:
        """(With the table's lock.) The tombstone of :meth:`_remember_broken`, once."""
        why = (
            f"session {session.id} ended: domain {session.domain}'s connection broke while it "
            "ran (a guest resumes only a session that was migrating, parked or checkpointed)"
        )
        t, sid = self.table, session.id
        if not (sid in t.entries() or sid in t.moved or sid in t.expired):
            t.expired[sid] = Gone(session, time.monotonic(), why=why)

    def _await_guest(self, session: DaemonSession, marker: object) -> None:
        def overdue() -> None:
            with about(session):
                self._reattach_overdue(session, marker)

        timer = threading.Timer(DOMAIN_REATTACH_GRACE_S, overdue)
        timer.daemon = True
        timer.start()

    def _reattach_overdue(self, session: DaemonSession, marker: object) -> None:
        """A VM guest whose connection broke did not attach again in time: its session ends
        once it is back (ready) here; while it is still away, look again later."""
        with self.table.lock:
            if session.detached is not marker:
                return
            state = session.state
        if state in (SessionState.MIGRATING, SessionState.CHECKPOINTING):
            self._await_guest(session, marker)
        elif state is SessionState.READY and self.table.find(session.id) is session:
            self.close(session, f"domain {session.domain}'s guest did not come back")

    def watch_guest(self, sid: str, token: bytes, gone: threading.Event, caller: Caller) -> None:
        """Hold a direct guest's presence stream: when ``gone`` is set (the stream ended: the
        guest process went away) while the same worker still serves the session and no other
        presence stream of its guest is open, stop that worker.

        The guest's calls go to the worker, so the daemon would otherwise never see the guest
        leave; the worker sees it only between calls, and a worker inside a kernel that never
        returns reads nothing. Returns without closing once that worker is gone (the session
        ended, was parked or moved: the guest opens a new presence with its next worker). A
        guest that reconnects opens its new presence before it ends the old one (the count)."""
        with self.table.lock:
            session = self.table.entries().get(sid)
            if session is None:
                raise ProtocolError("NOT_FOUND", f"no session {sid!r} on this daemon")
            bind_session(session)
            _entitled(session, token, caller)
            worker = session.worker
            session.presences += 1
        try:
            while not gone.wait(_PRESENCE_POLL_S):
                if session.worker is not worker or worker.exited:
                    return
        finally:
            with self.table.lock:
                session.presences -= 1
                last = session.presences == 0
        # a worker that died by itself is the reaper's to report, not the guest's doing
        if last and session.worker is worker and not worker.exited and alive(worker.pid):
            log.info("session %s: its direct guest went away; stopping its worker", sid)
            self.close(session, "guest went away")

    def resume(self, sid: str, token: bytes, caller: Caller) -> DaemonSession:
        """Where a guest whose stream broke stands: ready to attach, parked (retry), moved
        (redirect), or expired (NOT_FOUND with the reason: the guest stops waiting)."""
        self.expire()
        gone = self.table.gone(sid)
        if gone is not None:
            bind_session(gone.session)
            _entitled(gone.session, token, caller)
            if gone.to:
                raise SessionMoved(sid, gone.to)
            raise ProtocolError("NOT_FOUND", gone.why)
        session = self.table.get(sid)
        bind_session(session)
        _entitled(session, token, caller)
        if session.state in RETRY_LATER:
            raise ProtocolError(
                "UNAVAILABLE",
                f"session {sid} is {session.state.value}; retry",
                trailers=(("crane-parked", "1"),),
            )
        if _worker_died(session):  # not reaped yet: the same answer as once it is
            raise ProtocolError("NOT_FOUND", worker_exited(sid))
        session.require("resume")
        return session

    # ---- ending ----------------------------------------------------------------------------------
    def close(self, session: DaemonSession, why: str) -> None:
        """Tear a session down: stop its worker (freeing its device memory), forget it.

        A parked (or restoring, or moved) session has no stream and no worker to lose: a stream
        ending is what parking causes, so it does not close it.
        """
        with about(session):  # whoever closes it (a call, the reaper, shutdown): its lines
            self._close(session, why)

    def _close(self, session: DaemonSession, why: str) -> None:
        with self.table.lock:
            if session.state in ENDS_NOTHING:
                return
            session.move(SessionState.CLOSING)
        code = self.release(session)
        with self.table.lock:
            session.move(SessionState.CLOSED)
            self.table.remove(session)
            if session.broken:  # in the same step: a Resume never sees it simply gone
                self._broken_tombstone(session)
        if session.end_stream is not None:
            session.end_stream()
        log.info("session %s closed (%s); worker exit status %s", session.id, why, code)

    def mark_releasing(self, sid: str) -> threading.Event:
        """Announce that ``sid``'s worker here is about to be released (see
        :meth:`wait_released`); pass the event to :meth:`release`."""
        done = threading.Event()
        with self._releasing_lock:
            self._releasing[sid] = done
        return done

    def release(self, session: DaemonSession, marked: threading.Event | None = None) -> int | None:
        """Stop the worker and free what the session held on this host (not its entry)."""
        done = marked or self.mark_releasing(session.id)
        try:
            code = session.worker.stop()
            session.device.ledger.clear(session.slot)
            self.quotas.clear(session.slot)
            self.images.release_owner(session.worker.pid)  # its modules' pins
            session.stats.close()
            snapshots = SnapshotFile(snapshot_path(session.stats_path))
            self.book.retire(session.tenant, snapshots.read())
            snapshots.remove()
            ring = ring_socket_path(str(session.direct_socket)) if session.direct_socket else None
            for path in (session.stats_path, session.direct_socket, ring):
                if path is not None:
                    Path(path).unlink(missing_ok=True)
            self._free_port(session.tcp_port)  # the worker that listened on it is gone
            return code
        finally:
            done.set()
            with self._releasing_lock:
                if self._releasing.get(session.id) is done:
                    del self._releasing[session.id]

    def _free_port(self, port: int) -> None:
        if port and self.worker_tcp is not None:
            self.worker_tcp.free(port)

    def replenish_workers(self) -> None:
        self.pool.replenish()

    def wait_released(self, sid: str, timeout: float = 30.0) -> None:
        """Wait until a release of ``sid``'s previous worker here is over: it unlinks the
        session's stats file and direct socket by path, which a new worker for the same session
        reuses."""
        with self._releasing_lock:
            done = self._releasing.get(sid)
        if done is not None and not done.wait(timeout):
            raise ProtocolError(
                "UNAVAILABLE", f"session {sid}'s previous worker here is still exiting"
            )

    def close_all(self, why: str) -> None:
        self.expiry.stop()
        for s in self.list():
            self.close(s, why)

    # ---- operations that take a session away for a while -----------------------------------------
    def claim(
        self, sid: str, operation: str, to: SessionState
    ) -> tuple[DaemonSession, SessionState]:
        """Take session ``sid`` into ``to`` for ``operation`` (refused by name in a state that
        forbids it); the state it had, to go back to when the operation gives up."""
        session = self.table.get(sid)
        bind_session(session)  # a checkpoint or a migration: the call is about it
        with self.table.lock:
            session.require(operation)
            before = session.state
            session.move(to)
        return session, before

    def give_back(self, session: DaemonSession, during: SessionState, before: SessionState) -> None:
        """An operation that claimed the session gave up: back to ``before`` if it is still
        ``during`` (a session closed meanwhile stays closed)."""
        with self.table.lock:
            if session.state is during:
                if before is SessionState.RUNNING and session.domain and session.stream is None:
                    before = SessionState.READY  # its VM's connection broke meanwhile
                session.move(before)

    def moved_away(self, session: DaemonSession, to: str) -> threading.Event:
        """The session switched over to the daemon at ``to``: a tombstone redirects its guest.
        Its worker's release is announced at once (the session may come straight back): the
        event to pass to :meth:`release`."""
        released = self.mark_releasing(session.id)
        with self.table.lock:
            session.move(SessionState.MIGRATED)
            session.location = f"moved to {to}"
            self.table.remember_moved(session, to)
        return released

    def publish(
        self,
        session: DaemonSession,
        progress: dict[str, Any],
        switching: bool,
        fresh: bool = False,
    ) -> None:
        """A migration's progress (crane ps, crane migrate, a waiting Resume), merged into what
        was published before (``fresh``: a new migration, nothing kept of an earlier one);
        ``switching``: the guest is stopped for the switchover (or already moved), so a Resume
        waits for the redirect rather than being told to retry."""
        now = time.monotonic()
        if fresh:
            self.book.migration_started(session.id, now)
        phase = progress.get("phase")
        if phase in _MIGRATION_OVER:
            self.book.migration_over(session.id, session.tenant, phase == "done", now)
        session.migration = {**({} if fresh else session.migration), **progress}
        session.switching = switching
        self.changes.bump()

    def wait_switchover(self, sid: str, timeout: float = SWITCHOVER_WAIT_S) -> bool:
        """Wait while ``sid`` is stopped for its switchover (the guest's Resume comes moments
        before the worker's "done" reaches us); True if there was one to wait for."""
        deadline = time.monotonic() + timeout
        waited = False
        seen = self.changes.version
        while True:
            s = self.table.find(sid)
            if s is None or s.state is not SessionState.MIGRATING or not s.switching:
                return waited
            left = deadline - time.monotonic()
            if left <= 0:
                return waited
            waited = True
            seen = self.changes.wait(seen, min(left, _POLL_S))

    # ---- checkpoint and restore ------------------------------------------------------------------
    def checkpoint(
        self, sid: str, path: str, release: bool, wait_s: float = checkpoints.BOUNDARY_WAIT_S
    ) -> tuple[checkpoints.Checkpointed, SessionState, Path]:
        t0, ok = time.monotonic(), False
        try:
            out = checkpoints.checkpoint(self, sid, path, release, wait_s)
            ok = True
            return out
        finally:
            s = self.table.entries().get(sid)
            tenant = s.tenant if s is not None else ""
            self.book.operation("checkpoint", tenant, ok, time.monotonic() - t0)

    def restore(
        self, path: str, device_index: int, accept_lower: bool = False
    ) -> tuple[DaemonSession, int]:
        t0 = time.monotonic()
        try:
            session, done_seq = checkpoints.restore(self, path, device_index, accept_lower)
        except BaseException:
            self.book.operation("restore", "", False, time.monotonic() - t0)
            raise
        self.book.operation("restore", session.tenant, True, time.monotonic() - t0)
        return session, done_seq

    # ---- queries -----------------------------------------------------------------------------
    def get(self, sid: str) -> DaemonSession:
        return self.table.get(sid)

    def list(self) -> list[DaemonSession]:
        """Sessions on this daemon (parked ones included; not those that migrated away)."""
        return self.table.sessions()

    def listing(
        self, caller: Caller | None = None, domain: str | None = None
    ) -> list[DaemonSession]:
        """What ``crane ps`` shows: :meth:`list` plus the migrated-away entries still kept;
        for a ``caller`` who is no operator, only its tenant's (and its domain's); ``domain``:
        only that libvirt domain's sessions."""
        self.expire()
        with self.table.lock:
            out = list(self.table.entries().values()) + [
                g.session for g in self.table.moved.values()
            ]
        if domain is not None:
            out = [s for s in out if s.domain == domain]
        if caller is None or caller.operator:
            return out
        return [s for s in out if s.tenant == caller.tenant and s.domain == caller.domain]

    def expire(self, now: float | None = None) -> None:
        self.expiry.expire(now)


def _entitled(session: DaemonSession, token: bytes | None, caller: Caller) -> None:
    """Refuse a guest call on ``session`` without its resume token, or from a caller of
    another tenant (an operator excepted) even with it."""
    if not token or not secrets.compare_digest(token, session.token):
        raise ProtocolError(
            "PERMISSION_DENIED", f"wrong resume token for session {session.id} from {caller}"
        )
    may_use(caller, session.tenant, session.id, session.domain)


def worker_exited(sid: str) -> str:
    """Why a session whose worker died is gone: the one reason every path gives its guest
    (which fails the call with CUDA_ERROR_NO_DEVICE and this text; docs/design.md, Errors)."""
    return f"session {sid} ended: its worker process exited"


def _worker_died(session: DaemonSession) -> bool:
    """The session's worker is gone though the daemon did not stop it (killed, crashed), or
    the session is being torn down; a reaped or zombie worker counts as gone."""
    if session.state in (SessionState.CLOSING, SessionState.CLOSED):
        return True
    proc = session.worker.proc
    return proc.returncode is not None or not alive(proc.pid)


def _clear_stale(directory: Path) -> None:
    """Remove what a previous daemon on this run directory left of its sessions (stats files,
    direct sockets, migration progress): after a crash nothing released them, and no session
    of theirs lives in this daemon (the device ledgers are reset likewise)."""
    stale = [p for p in directory.iterdir() if p.is_file() or p.is_socket()]
    for path in stale:
        path.unlink(missing_ok=True)
    if stale:
        log.info("removed %d stale session file(s) from %s", len(stale), directory)
