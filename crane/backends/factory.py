"""Builds a session's backend inside its worker process from the daemon's configuration."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from crane.backends.base import Backend
from crane.device.ledger import Ledger

__all__ = ["WorkerConfig", "make_backend"]


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs to serve one session (sent as JSON by the daemon)."""

    session_id: str
    backend: str  # "sim" or "cuda"
    profile: str  # sim profile key; for cuda the device ordinal as text
    va_base: int
    va_size: int
    uuid_seed: str  # hex; the session's virtual device identity derives from it
    ledger_path: str
    ledger_slot: int
    module_cache: str
    stats_path: str
    token: str = ""  # hex resume token, checked by the worker's direct endpoint
    direct_socket: str = ""  # unix socket path for guests on this host ("" = relay only)
    attach_timeout_s: float = 60.0  # end a session whose guest never attaches

    def to_json(self) -> dict:
        return asdict(self)


def make_backend(cfg: WorkerConfig) -> Backend:
    if cfg.backend == "sim":
        from crane.backends.sim.backend import SimBackend
        from crane.backends.sim.profiles import get_profile

        profile = get_profile(cfg.profile)
        ledger = Ledger(cfg.ledger_path, profile.total_mem)
        snapshot = profile.snapshot(bytes.fromhex(cfg.uuid_seed))
        return SimBackend(profile, snapshot, (cfg.va_base, cfg.va_size), ledger, cfg.ledger_slot)
    if cfg.backend == "cuda":
        from crane.backends.cuda import driver
        from crane.backends.cuda.backend import CudaBackend
        from crane.backends.cuda.device import device_snapshot

        drv = driver.load()
        driver.check("cuInit", drv.cuInit(0))
        ordinal = int(cfg.profile or 0)
        snapshot = device_snapshot(drv, ordinal, bytes.fromhex(cfg.uuid_seed))
        ledger = Ledger(cfg.ledger_path, snapshot.total_mem)
        window = (cfg.va_base, cfg.va_size)
        return CudaBackend(drv, ordinal, snapshot, window, ledger, cfg.ledger_slot)
    raise ValueError(f"backend {cfg.backend!r} is not available in this build")
