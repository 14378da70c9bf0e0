"""Entry point of a session's worker process (``python -m crane.worker.main --fd N``).

The daemon spawns workers ahead of demand; a worker imports everything, then blocks until the
daemon sends its session's configuration. It builds the backend (its own CUDA context or
simulated device: invariant 4), answers with the device identity the guest will see, and then
serves call batches until the daemon closes the channel or the guest closes the session. Exiting
the process frees everything the session held, whatever state it was in.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from crane.backends.factory import WorkerConfig, make_backend
from crane.engine.engine import Engine
from crane.modules.store import ImageStore
from crane.wire.batch_flags import EXPECTS_REPLY, peek_flags
from crane.wire.malloc import tune_malloc
from crane.worker.channel import Channel, ChannelClosed, Tag
from crane.worker.direct import start_direct_server
from crane.worker.session_state import SessionParked, WorkerSession
from crane.worker.stats import MODE_RELAY, SessionStats

__all__ = ["main", "serve"]

log = logging.getLogger("crane.worker")


def serve(ch: Channel) -> int:
    tag, raw = ch.recv()
    if tag != Tag.CONFIG:
        log.error("worker expected its configuration first, got frame tag %d", tag)
        return 2
    cfg = WorkerConfig(**json.loads(raw))
    logging.getLogger().handlers[0].setFormatter(
        logging.Formatter(f"%(asctime)s craned[worker {cfg.session_id}] %(levelname)s %(message)s")
    )
    try:
        backend = make_backend(cfg)
    except Exception as e:
        log.exception("cannot start the backend")
        ch.send(Tag.CLOSE, f"backend failed to start: {e}".encode())
        return 1
    engine = Engine.create(
        backend, cfg.session_id, (cfg.va_base, cfg.va_size), ImageStore(cfg.module_cache)
    )
    ws = WorkerSession(engine, cfg.session_id, SessionStats(cfg.stats_path))
    from crane.device.identity import snapshot_to_proto

    def end_session() -> None:
        ws.ended.set()
        ch.shutdown()  # wakes the loop below, which then exits

    direct = None
    if cfg.direct_socket:
        direct = start_direct_server(
            cfg.direct_socket, cfg.session_id, bytes.fromhex(cfg.token), ws, end_session
        )
    abandon = threading.Timer(cfg.attach_timeout_s, _abandon_if_unattached, (ws, end_session))
    abandon.daemon = True
    abandon.start()
    ch.send(Tag.REPLY, snapshot_to_proto(backend.snapshot).SerializeToString())
    from crane.migrate.worker_side import MigrationFrames

    migration = MigrationFrames(ws, Path(cfg.stats_path).with_suffix(".migrate"))
    try:
        while True:
            tag, raw = ch.recv()
            if tag in (Tag.CHECKPOINT, Tag.RESTORE):
                answer = _control(ws, tag, json.loads(raw))
                ch.send(Tag.CONTROL_REPLY, json.dumps(answer).encode())
                if tag == Tag.RESTORE and "error" not in answer:
                    abandon.cancel()  # the guest reconnects now: give it the full time again
                    abandon = threading.Timer(
                        cfg.attach_timeout_s, _abandon_if_unattached, (ws, end_session)
                    )
                    abandon.daemon = True
                    abandon.start()
                continue
            if tag in _MIGRATE_TAGS:
                answer = migration.frame(tag, raw)
                if answer is not None:
                    ch.send(Tag.CONTROL_REPLY, json.dumps(answer).encode())
                    if tag == Tag.MIGRATE_IN_END and answer.get("final") and "error" not in answer:
                        abandon.cancel()  # switched over: the guest reconnects now
                        abandon = threading.Timer(
                            cfg.attach_timeout_s, _abandon_if_unattached, (ws, end_session)
                        )
                        abandon.daemon = True
                        abandon.start()
                elif tag == Tag.MIGRATE_IN:
                    abandon.cancel()  # incoming: no guest until the final round
                continue
            if tag != Tag.BATCH:
                log.error("unexpected frame tag %d from the daemon", tag)
                continue
            if ws.parked:
                log.error("relayed batch refused: the session is parked")
                continue
            if not ws.relay and not ws.attach(MODE_RELAY, "relay"):
                log.error("relayed batch refused: the guest is attached directly")
                continue
            try:
                msgs = ws.run(raw)
            except SessionParked:  # moved away while the batch waited: the daemon releases us
                log.info("relayed batch refused: the session migrated while it waited")
                continue
            last = len(msgs) - 1 if peek_flags(raw) & EXPECTS_REPLY else -1
            for i, msg in enumerate(msgs):
                ch.send(Tag.REPLY_LAST if i == last else Tag.REPLY, msg)
            if engine.device.closed:
                ch.send(Tag.CLOSE)
                break
    except ChannelClosed:
        log.info("session ended" if ws.ended.is_set() else "daemon closed the session channel")
    finally:
        abandon.cancel()
        if direct is not None:
            direct.stop(grace=0.5)
        backend.close()
        ws.stats.close()
    return 0


_MIGRATE_TAGS = frozenset({Tag.MIGRATE, Tag.MIGRATE_IN, Tag.MIGRATE_DATA, Tag.MIGRATE_IN_END})


def _control(ws: WorkerSession, tag: int, req: dict) -> dict:
    """Checkpoint or restore under the batch lock (so at a call boundary); errors as text."""
    from crane.api.results import CudaError
    from crane.state.checkpoint import CheckpointError
    from crane.state.park import restore_checkpoint, write_checkpoint

    path = Path(req["path"])
    with ws.lock:
        try:
            if tag == Tag.CHECKPOINT:
                if ws.parked:
                    return {"error": "the session is already parked"}
                tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
                try:
                    with open(tmp, "wb", buffering=1 << 20) as f:
                        eng = ws.engine
                        counts = write_checkpoint(eng.device, eng.log, f, req["identity"])
                        f.flush()
                        os.fsync(f.fileno())
                    tmp.replace(path)  # a checkpoint file is complete or absent
                finally:
                    tmp.unlink(missing_ok=True)
                if req.get("release"):
                    ws.parked = True
                log.info("checkpoint written to %s (%d bytes)", path, counts["bytes"])
                return counts
            with open(path, "rb", buffering=1 << 20) as f:
                meta = restore_checkpoint(ws.engine.device, ws.engine.log, f, path.name)
            log.info("restored from %s", path)
            return {"meta": meta, "done_seq": ws.engine.log.done_seq}
        except CheckpointError as e:
            return {"error": str(e)}
        except CudaError as e:
            return {"error": f"{e.code.name if hasattr(e.code, 'name') else e.code}: {e.message}"}
        except OSError as e:
            return {"error": f"{path}: {e.strerror or e}"}
        except Exception as e:  # a bug: report it to the operator rather than kill the session
            log.exception("%s failed", "checkpoint" if tag == Tag.CHECKPOINT else "restore")
            return {"error": f"internal error: {e!r}"}


def _abandon_if_unattached(ws: WorkerSession, end: Callable[[], None]) -> None:
    if not ws.attached.is_set():
        log.warning("no call stream attached in time; ending the session")
        end()


#: Imported while the worker waits in the pool, not after its session's configuration arrives:
#: each costs tens of milliseconds (more where bytecode is not cached), which would otherwise land
#: on a session open, a restore or the first checkpoint. Optional backends may be missing.
_PRELOAD = (
    "crane.device.identity",
    "crane.backends.sim.backend",
    "crane.device.ledger",
    "crane.backends.sim.profiles",
    "crane.migrate.worker_side",
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
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s craned[worker] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    # The daemon owns signals: a Ctrl-C in craned's terminal must not kill sessions mid-call.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
