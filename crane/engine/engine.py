"""One session's engine, assembled: device state, dispatcher and codec over one backend."""

from __future__ import annotations

from dataclasses import dataclass

from crane.api.ops import OPS
from crane.backends.base import Backend
from crane.engine.codec import BatchCodec, CallLog
from crane.engine.dispatch import Dispatcher
from crane.engine.meter import Meter
from crane.engine.model import SessionDevice
from crane.modules.store import ImageStore

__all__ = ["Engine"]


@dataclass
class Engine:
    """What a worker runs a session with; the state record and migration take its parts."""

    device: SessionDevice
    codec: BatchCodec
    #: The session's accounting (None: turned off by the daemon's ``accounting = false``).
    meter: Meter | None = None

    @classmethod
    def create(
        cls,
        backend: Backend,
        session_id: str,
        window: tuple[int, int],
        images: ImageStore,
        accounting: bool = True,
        profile_window_s: float = 60.0,
    ) -> Engine:
        device = SessionDevice(backend, window, images)
        meter = None
        if accounting:
            meter = Meter(
                OPS,
                lambda h: device.functions.get(h).obj,
                window_s=profile_window_s,
                inline=not backend.async_work,
            )
            backend.report_work(meter.work)
        dispatcher = Dispatcher(device, meter)
        return cls(device, BatchCodec(dispatcher, session_id, backend.take_stdout), meter)

    @property
    def log(self) -> CallLog:
        return self.codec.log

    def run_batch(self, raw: bytes) -> list[bytes]:
        out = self.codec.run_batch(raw)
        if self.meter is not None and not self.meter.inline:
            self.device.backend.settle_work()
        return out

    def settle_work(self) -> None:
        """Collect the GPU time of work that completed (before the accounting is read)."""
        if self.meter is not None and not self.meter.inline:
            self.device.backend.settle_work()
