"""Migration frames on a worker's channel: start an outgoing migration, or apply incoming rounds.

Why a progress file rather than channel frames for the outgoing side: the channel is shared with
the relay, which reads it per batch and forwards whatever comes; a migration runs alongside the
guest's batches for many seconds, so it reports where the daemon can read it without taking the
channel (written atomically, like the session's stats), and wakes the daemon's watcher with a
byte on a FIFO the daemon named (``wake``) rather than letting it poll: the final update is on
the guest's clock.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from crane.host.messages import (
    ControlAnswer,
    DataPlaneOpen,
    DataPlaneReady,
    MigrateRequest,
    Refused,
    RoundApplied,
    RoundBegin,
)
from crane.migrate import source
from crane.migrate.dataplane import TlsPaths
from crane.migrate.target import RoundApplier
from crane.worker.attach import NotAllowed, WorkerSession, WorkerState

__all__ = ["MigrationFrames", "write_progress"]


def write_progress(path: Path, st: dict[str, Any], wake: str = "") -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(st))
    tmp.replace(path)
    if wake:
        try:  # best effort: a full FIFO is already a wake-up, a missing one means poll
            fd = os.open(wake, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return
        with contextlib.suppress(OSError):
            os.write(fd, b"!")
        os.close(fd)


class MigrationFrames:
    def __init__(self, ws: WorkerSession, progress_path: Path) -> None:
        self.ws = ws
        self.progress_path = progress_path
        self.applier = RoundApplier(ws.engine.device, ws.engine.log)
        self.final = False

    def migrate_out(self, req: MigrateRequest) -> None:
        """Start moving the session (its outcome lands in the progress file)."""
        self.progress_path.unlink(missing_ok=True)
        path, wake = self.progress_path, req.wake

        def progress(st: dict[str, Any]) -> None:
            write_progress(path, st, wake)

        try:
            self.ws.require("migrate out")
        except NotAllowed as e:
            progress({"phase": source.Phase.FAILED.value, "error": str(e)})
            return
        source.start(self.ws, req, progress)

    def begin(self, req: RoundBegin) -> bool:
        """A round comes in; False when this session cannot take one (answered at its end)."""
        try:
            self.ws.require("receive a migration round")
        except NotAllowed:
            return False
        self.ws.move(WorkerState.INCOMING)
        self.final = req.final
        self.applier.begin(req.fresh, req.round)
        return True

    def open_plane(self, req: DataPlaneOpen) -> DataPlaneReady:
        """Listen for the source's data-plane connections (crane.migrate.dataplane) and, when
        asked, on the hand-over socket for a same-host source (crane.migrate.handover)."""
        if self.ws.state is not WorkerState.INCOMING:
            why = f"session {self.ws.session_id} is {self.ws.state.value}"
            return DataPlaneReady(0, why, handover_error=why)
        token = bytes.fromhex(req.token)
        tls = TlsPaths(req.tls_cert, req.tls_key, req.tls_ca) if req.tls_cert else None
        port, error, handover, handover_error = 0, "", "", ""
        try:
            port = self.applier.open_plane(token, req.bind, tls)
        except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
            error = f"cannot listen on {req.bind}: {e}"
        if req.handover:
            try:
                handover = self.applier.open_handover(token, req.handover)
            except OSError as e:
                handover_error = f"cannot listen on {req.handover}: {e}"
        return DataPlaneReady(port, error, handover, handover_error)

    def feed(self, data: bytes) -> None:
        self.applier.feed(data)

    def end(self, chunks: int = 0, handed_over: bool = False) -> ControlAnswer:
        """Wait for the round to be applied; the answer for the daemon."""
        if self.ws.state is not WorkerState.INCOMING:
            return Refused(f"session {self.ws.session_id} is {self.ws.state.value}: no round")
        answer = self.applier.end(chunks, handed_over)
        if "error" in answer:
            return Refused(answer["error"])
        self.ws.publish_stats()
        if self.final:
            self.applier.close()  # the data plane served its last round
            self.ws.move(WorkerState.WAITING)  # switched over: its guest attaches next
        return RoundApplied(int(answer["done_seq"]), self.final)
