"""The devices a daemon serves, chosen from its ``backend`` settings.

``auto`` means the real GPU when cuda-python finds one and Crane's cuda backend is available,
else the simulated H100; the choice and its reason are logged, because an operator who expected
a GPU must be able to see why a session runs on the simulator.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from crane.backends.sim.ledger import Ledger
from crane.backends.sim.profiles import get_profile

__all__ = ["DEFAULT_SIM_PROFILE", "Device", "resolve_devices"]

log = logging.getLogger("craned")

DEFAULT_SIM_PROFILE = "h100-80gb"


@dataclass
class Device:
    index: int
    backend: str  # "sim" or "cuda"
    profile: str  # sim profile key, or the CUDA ordinal as text
    name: str
    total_mem: int
    cc: tuple[int, int]
    ledger: Ledger
    uuid: str

    @property
    def ledger_path(self) -> str:
        return str(self.ledger.path)


def _probe_gpu() -> tuple[int, str]:
    """(number of GPUs cuda-python sees, reason text)."""
    try:
        from cuda.bindings import driver  # type: ignore[import-not-found]
    except ImportError:
        return 0, "cuda-python is not installed"
    (err,) = driver.cuInit(0)[:1]
    if int(err) != 0:
        return 0, f"cuInit failed ({err})"
    err, count = driver.cuDeviceGetCount()
    if int(err) != 0 or count == 0:
        return 0, "cuda-python found no GPU"
    return count, f"cuda-python found {count} GPU(s)"


def resolve_devices(specs: list[str], run_dir: Path) -> tuple[list[Device], str]:
    """Turn backend specs into devices; returns them and a human summary of the choice."""
    devices: list[Device] = []
    notes: list[str] = []
    for spec in specs:
        kind, _, arg = spec.partition(":")
        if kind == "auto":
            count, why = _probe_gpu()
            if count:
                why += "; the cuda backend is not part of this build, using the simulated GPU"
            notes.append(f"auto: {why} -> sim:{DEFAULT_SIM_PROFILE}")
            kind, arg = "sim", DEFAULT_SIM_PROFILE
        if kind == "cuda":
            raise ValueError(
                f"backend {spec!r}: the cuda backend is not part of this build; use sim:PROFILE"
            )
        if kind != "sim":
            raise ValueError(f"unknown backend {spec!r}: use auto, cuda[:N] or sim:PROFILE")
        profile = get_profile(arg or DEFAULT_SIM_PROFILE)
        index = len(devices)
        ledger = Ledger(run_dir / f"device{index}.ledger", profile.total_mem)
        ledger.reset()
        devices.append(
            Device(
                index,
                "sim",
                profile.key,
                profile.name,
                profile.total_mem,
                profile.compute_capability,
                ledger,
                _uuid_text(profile.uuid_for(f"device{index}".encode())),
            )
        )
        notes.append(f"device {index}: sim:{profile.key} ({profile.name})")
    return devices, "; ".join(notes)


def _uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
