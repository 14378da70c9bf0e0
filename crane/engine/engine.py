"""One session's engine, assembled: device state, dispatcher and codec over one backend."""

from __future__ import annotations

from dataclasses import dataclass

from crane.backends.base import Backend
from crane.engine.codec import BatchCodec, CallLog
from crane.engine.dispatch import Dispatcher
from crane.engine.model import SessionDevice
from crane.modules.store import ImageStore

__all__ = ["Engine"]


@dataclass
class Engine:
    """What a worker runs a session with; the state record and migration take its parts."""

    device: SessionDevice
    codec: BatchCodec

    @classmethod
    def create(
        cls, backend: Backend, session_id: str, window: tuple[int, int], images: ImageStore
    ) -> Engine:
        device = SessionDevice(backend, window, images)
        return cls(device, BatchCodec(Dispatcher(device), session_id, backend.take_stdout))

    @property
    def log(self) -> CallLog:
        return self.codec.log

    def run_batch(self, raw: bytes) -> list[bytes]:
        return self.codec.run_batch(raw)
