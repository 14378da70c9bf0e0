"""Entry point of a session's worker process (``python -m crane.craned.worker --fd N``).

The daemon spawns workers ahead of demand; a worker imports everything, then blocks until the
daemon sends its session's configuration. It builds the backend (its own CUDA context or
simulated device: invariant 4) and the session's engine, answers with the device identity the
guest will see, and then serves the daemon's frames until the daemon closes the channel or the
guest closes the session: call batches (relayed), checkpoint and restore requests
(:mod:`crane.worker.control`), migration frames (:mod:`crane.migrate.worker_side`). Exiting the
process frees everything the session held, whatever state it was in.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from crane.backends.factory import make_backend
from crane.craned.worker_endpoint import start_worker_tcp
from crane.device.identity import snapshot_to_proto
from crane.engine.engine import Engine
from crane.host import logs
from crane.host.channel import Channel, ChannelClosed
from crane.host.lifeline import die_with_parent
from crane.host.malloc import tune_malloc
from crane.host.messages import (
    CheckpointRequest,
    DataPlaneOpen,
    MessageError,
    MigrateRequest,
    Restored,
    RestoreRequest,
    RoundApplied,
    RoundBegin,
    Tag,
    WorkerConfig,
    decode,
    encode,
)
from crane.host.stats import MODE_RELAY, SessionStats, SnapshotFile, snapshot_path
from crane.migrate.worker_side import MigrationFrames
from crane.modules.store import ImageStore
from crane.wire.batch_flags import EXPECTS_REPLY, peek_flags
from crane.wire.ring import ring_socket_path
from crane.worker import control
from crane.worker.attach import SessionParked, TooLate, WorkerSession
from crane.worker.direct import start_direct_server
from crane.worker.ring import start_ring_server

__all__ = ["main", "serve"]

log = logging.getLogger("crane.worker")


class _Abandon:
    """Ends a session whose guest never attaches within ``timeout`` (re-armed whenever the
    guest is due to attach anew: after a restore, after a migration's switchover)."""

    def __init__(self, ws: WorkerSession, timeout: float, end: Callable[[], None]) -> None:
        self.ws, self.timeout, self.end = ws, timeout, end
        self.timer: threading.Timer | None = None
        self.arm()

    def arm(self) -> None:
        self.cancel()
        self.timer = threading.Timer(self.timeout, self._fire)
        self.timer.daemon = True
        self.timer.start()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def _fire(self) -> None:
        if not self.ws.attached.is_set():
            log.warning("no call stream attached in time; ending the session")
            self.end()


def serve(ch: Channel) -> int:
    tag, raw = ch.recv()
    try:
        cfg: WorkerConfig = decode(tag, raw)
        if not isinstance(cfg, WorkerConfig):
            raise MessageError(f"expected the worker's configuration, got {type(cfg).__name__}")
    except MessageError as e:
        log.error("worker cannot start: %s", e)
        return 2
    # every line of this process is about its one session from now on
    logs.set_process_context(cfg.session_id, cfg.tenant, cfg.domain)
    # the simulated GPU's compiled kernels, kept beside the module images for the next worker
    os.environ.setdefault("CRANE_PTX_JIT_CACHE", str(Path(cfg.module_cache).parent / "ptx-jit"))
    window = (cfg.va_base, cfg.va_size)
    try:
        backend = make_backend(
            cfg.backend,
            cfg.device_arg,
            window,
            bytes.fromhex(cfg.uuid_seed),
            cfg.ledger_path,
            cfg.ledger_slot,
            tenant_ledger=cfg.tenant_ledger,
            tenant=cfg.tenant,
            kernel_time_limit_s=cfg.kernel_time_limit_s,
            model=cfg.model,
        )
    except Exception as e:
        log.exception("cannot start the backend")
        ch.send(Tag.CLOSE, f"backend failed to start: {e}".encode())
        return 1
    images = ImageStore(cfg.module_cache, cfg.module_cache_bytes)
    engine = Engine.create(
        backend,
        cfg.session_id,
        window,
        images,
        accounting=cfg.accounting,
        profile_window_s=cfg.profile_window_s,
    )
    snapshots = SnapshotFile(snapshot_path(cfg.stats_path))
    ws = WorkerSession(engine, cfg.session_id, SessionStats(cfg.stats_path), snapshots)
    stop_publishing = threading.Event()
    if ws.snapshots is not None:
        threading.Thread(
            target=ws.publish_while_idle, args=(stop_publishing,), daemon=True, name="publish"
        ).start()

    def end_session() -> None:
        ws.end()
        ch.shutdown()  # wakes the loop below, which then exits

    direct = None
    if cfg.direct_socket:
        direct = start_direct_server(
            cfg.direct_socket,
            cfg.session_id,
            bytes.fromhex(cfg.token),
            ws,
            end_session,
            cfg.direct_uid,
        )
    remote = start_worker_tcp(cfg, ws, end_session)  # remote guests skip the relay too
    ring = None
    if cfg.direct_socket and cfg.call_ring:
        ring = start_ring_server(
            ring_socket_path(cfg.direct_socket),
            cfg.session_id,
            bytes.fromhex(cfg.token),
            ws,
            end_session,
            cfg.direct_uid,
        )
    abandon = _Abandon(ws, cfg.attach_timeout_s, end_session)
    ch.send(Tag.STARTED, snapshot_to_proto(backend.snapshot).SerializeToString())
    migration = MigrationFrames(ws, Path(cfg.stats_path).with_suffix(".migrate"))
    try:
        while True:
            tag, raw = ch.recv()
            if tag == Tag.BATCH:
                if _relay(ch, ws, raw):
                    ch.send(Tag.CLOSE)
                    break
            elif tag == Tag.MIGRATE_DATA:
                migration.feed(raw)
            else:
                _control_frame(ch, ws, migration, abandon, tag, raw)
    except ChannelClosed:
        log.info("session ended" if ws.ended.is_set() else "daemon closed the session channel")
    finally:
        stop_publishing.set()
        abandon.cancel()
        for server in (direct, remote):
            if server is not None:
                server.stop(grace=0.5)
        if ring is not None:
            ring.stop()
        _close_after_the_batch(ws, backend)
        ws.stats.close()
    return 0


#: how long a worker whose session ended waits for a batch still running (a long kernel)
BATCH_WAIT_S = 2.0


def _close_after_the_batch(ws: WorkerSession, backend) -> None:
    """Release the device once no batch runs. Why: closing it unmaps the session's memory, and
    a kernel still running on a batch thread (its guest killed mid-kernel) then touched unmapped
    pages: the worker died of SIGSEGV. If the batch does not end within :data:`BATCH_WAIT_S`,
    the process ends at once instead (the kernel computes for nobody; the exit frees
    everything it held), without unmapping under the kernel or finalizing what it uses."""
    try:
        ws.acquire_by(time.monotonic() + BATCH_WAIT_S, "closing the device")
    except TooLate as e:
        log.warning("session %s ended, but %s: the worker exits without waiting", ws.session_id, e)
    else:
        try:
            backend.close()
        finally:
            ws.lock.release()
        return
    logging.shutdown()
    os._exit(0)


def _relay(ch: Channel, ws: WorkerSession, raw: bytes) -> bool:
    """Run one relayed batch and send its answers; True once the guest closed the session."""
    if not ws.relay and not ws.attach(MODE_RELAY, "relay"):
        log.error("relayed batch refused: session %s is %s", ws.session_id, ws.state.value)
        return False
    try:
        msgs = ws.run(raw)
    except SessionParked:  # moved away while the batch waited: the daemon releases us
        log.info("relayed batch refused: the session migrated while it waited")
        return False
    closed = ws.engine.device.closed
    # a batch that closed the session ends with CLOSE, not REPLY_LAST: the daemon then ends the
    # guest's stream after the answers instead of waiting for a next batch that never comes
    last = len(msgs) - 1 if peek_flags(raw) & EXPECTS_REPLY and not closed else -1
    for i, msg in enumerate(msgs):
        ch.send(Tag.REPLY_LAST if i == last else Tag.REPLY, msg)
    return closed


def _control_frame(
    ch: Channel,
    ws: WorkerSession,
    migration: MigrationFrames,
    abandon: _Abandon,
    tag: int,
    raw: bytes,
) -> None:
    """A typed request from the daemon; answered when it asks for an answer."""
    try:
        msg = decode(tag, raw)
    except MessageError as e:
        log.error("frame from the daemon refused: %s", e)
        return
    if isinstance(msg, CheckpointRequest):
        ch.send(*encode(control.checkpoint(ws, msg)))
    elif isinstance(msg, RestoreRequest):
        answer = control.restore(ws, msg)
        ch.send(*encode(answer))
        if isinstance(answer, Restored):
            abandon.arm()  # the guest reconnects now: give it the full time again
    elif isinstance(msg, MigrateRequest):
        migration.migrate_out(msg)
    elif isinstance(msg, RoundBegin):
        if migration.begin(msg):
            abandon.cancel()  # incoming: no guest until the final round
    elif isinstance(msg, DataPlaneOpen):
        ch.send(*encode(migration.open_plane(msg)))
    else:  # RoundEnd: the round's bytes are all here
        answer = migration.end(msg.chunks, msg.handed_over)
        ch.send(*encode(answer))
        if isinstance(answer, RoundApplied) and answer.final:
            abandon.arm()  # switched over: the guest reconnects now


#: Imported while the worker waits in the pool, not after its session's configuration arrives:
#: each costs tens of milliseconds (more where bytecode is not cached), which would otherwise land
#: on a session open, a restore or the first checkpoint. Optional backends may be missing.
_PRELOAD = (
    "crane.backends.sim.backend",
    "crane.backends.sim.profiles",
    "crane.state.checkpoint",
    "crane.state.park",
)


def _preload() -> None:
    import importlib

    for name in _PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError as e:  # reported where the module is needed
            log.debug("preload of %s failed: %s", name, e)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="crane-worker")
    parser.add_argument("--fd", type=int, required=True, help="inherited socket to the daemon")
    parser.add_argument("--log-level", default=os.environ.get("CRANE_LOG_LEVEL", "INFO"))
    parser.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        default=os.environ.get("CRANE_LOG_FORMAT") or "text",
        help="craned's: text or json (crane.host.logs)",
    )
    parser.add_argument("--parent", type=int, default=0, help="craned's pid: die with it")
    args = parser.parse_args(argv)
    logs.setup(args.log_level, args.log_format, "worker")
    # The daemon owns signals: a Ctrl-C in craned's terminal must not kill sessions mid-call.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # `kill -USR1 PID` writes every thread's stack into craned's log (the worker's stderr):
    # where a session that does not answer is waiting, without stopping it
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # A kernel that never returns must not outlive craned (crane.host.lifeline).
    if args.parent and not die_with_parent(args.parent):
        log.error("craned (pid %d) is gone; not starting", args.parent)
        return 1
    tune_malloc()
    _preload()
    ch = Channel(socket.socket(fileno=args.fd))
    profile_dir = os.environ.get("CRANE_WORKER_PROFILE")  # developers: cProfile each worker
    profiler = None
    if profile_dir:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    try:
        return serve(ch)
    except ChannelClosed:
        return 0
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(os.path.join(profile_dir, f"worker-{os.getpid()}.prof"))


if __name__ == "__main__":
    sys.exit(main())
