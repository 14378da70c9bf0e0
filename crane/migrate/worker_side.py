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

from crane.migrate import source
from crane.migrate.target import RoundApplier
from crane.worker.channel import Tag
from crane.worker.session_state import WorkerSession

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

    def frame(self, tag: int, raw: bytes) -> dict[str, Any] | None:
        """Handle one frame; the answer to send back, if the frame needs one."""
        if tag == Tag.MIGRATE:
            req = json.loads(raw)
            self.progress_path.unlink(missing_ok=True)
            wake = str(req.get("wake") or "")
            source.start(self.ws, req, lambda st: write_progress(self.progress_path, st, wake))
            return None
        if tag == Tag.MIGRATE_IN:
            req = json.loads(raw)
            self.final = bool(req.get("final"))
            self.applier.begin(bool(req.get("fresh")), int(req.get("round", 0)))
            return None
        if tag == Tag.MIGRATE_DATA:
            self.applier.feed(raw)
            return None
        answer = self.applier.end()
        answer["final"] = self.final
        return answer
