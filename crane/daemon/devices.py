"""The devices a daemon serves, chosen from its ``backend`` settings.

``auto`` means the first real GPU when NVML finds one and the cuda backend can run (cuda-python
installed), else the simulated H100; the choice and its reason are logged, because an operator
who expected a GPU must be able to see why a session runs on the simulator.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from crane.backends.sim.ledger import Ledger
from crane.backends.sim.profiles import get_profile
from crane.daemon.gpu_inventory import GpuInfo, NvmlUnavailable, list_gpus

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
    driver_version: str = "crane-sim"

    @property
    def ledger_path(self) -> str:
        return str(self.ledger.path)


def _probe_gpus() -> tuple[list[GpuInfo], str]:
    """The host's GPUs and a reason text (why there are none, or how many were found)."""
    try:
        gpus = list_gpus()
    except NvmlUnavailable as e:
        return [], str(e)
    if not gpus:
        return [], "the inventory found no GPU"
    return gpus, f"the inventory found {len(gpus)} GPU(s)"


def _cuda_backend_missing() -> str:
    """Why the cuda backend cannot run sessions here ("" when it can)."""
    try:
        from crane.backends.cuda import driver

        driver.load()
    except Exception as e:  # DriverUnavailable, or a broken cuda-python install
        return str(e)
    return ""


def _pick_gpu(gpus: list[GpuInfo], arg: str, spec: str) -> GpuInfo:
    """``cuda`` / ``cuda:N`` (PCI bus order, as nvidia-smi numbers them) / ``cuda:GPU-uuid``."""
    if not arg:
        arg = "0"
    if arg.upper().startswith("GPU-") or arg.upper().startswith("MIG-"):
        for g in gpus:
            if g.uuid.lower() == arg.lower():
                return g
        raise ValueError(
            f"backend {spec!r}: no GPU with UUID {arg} (have: "
            + ", ".join(g.uuid for g in gpus)
            + ")"
        )
    if not arg.isdigit():
        raise ValueError(f"backend {spec!r}: expected cuda:INDEX or cuda:GPU-UUID")
    if int(arg) >= len(gpus):
        raise ValueError(f"backend {spec!r}: this host has {len(gpus)} GPU(s)")
    return gpus[int(arg)]


def resolve_devices(specs: list[str], run_dir: Path) -> tuple[list[Device], str]:
    """Turn backend specs into devices; returns them and a human summary of the choice."""
    devices: list[Device] = []
    notes: list[str] = []
    probed: dict[str, tuple[list[GpuInfo], str, str]] = {}

    def probe() -> tuple[list[GpuInfo], str, str]:
        """(GPUs, how they were found, why the cuda backend cannot run): asked once, since
        without NVML the inventory is a child process."""
        if not probed:
            gpus, why = _probe_gpus()
            probed["host"] = (gpus, why, _cuda_backend_missing() if gpus else "")
        return probed["host"]

    for spec in specs:
        kind, _, arg = spec.partition(":")
        index = len(devices)
        if kind == "auto":
            gpus, why, missing = probe()
            if gpus and not missing:
                notes.append(f"auto: {why} -> cuda:0")
                kind, arg = "cuda", "0"
            else:
                if missing:
                    why += f", but the cuda backend cannot run: {missing}"
                notes.append(f"auto: {why} -> sim:{DEFAULT_SIM_PROFILE}")
                kind, arg = "sim", DEFAULT_SIM_PROFILE
        if kind == "cuda":
            gpus, why, missing = probe()
            if not gpus or missing:
                raise ValueError(f"backend {spec!r}: {missing or why}")
            gpu = _pick_gpu(gpus, arg, spec)
            # CUDA numbers devices fastest-first by default; workers must agree with NVML.
            os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            fields = ("cuda", str(gpu.index), gpu.name, gpu.total_mem, gpu.cc)
            uuid, driver = gpu.uuid, gpu.driver_version
            notes.append(f"device {index}: cuda:{gpu.index} ({gpu.name}, {gpu.pci_bus_id})")
        elif kind == "sim":
            profile = get_profile(arg or DEFAULT_SIM_PROFILE)
            fields = (
                "sim",
                profile.key,
                profile.name,
                profile.total_mem,
                profile.compute_capability,
            )
            uuid = _uuid_text(profile.uuid_for(f"device{index}".encode()))
            driver = "crane-sim"
            notes.append(f"device {index}: sim:{profile.key} ({profile.name})")
        else:
            raise ValueError(f"unknown backend {spec!r}: use auto, cuda[:N] or sim:PROFILE")
        ledger = Ledger(run_dir / f"device{index}.ledger", fields[3])
        ledger.reset()
        devices.append(Device(index, *fields, ledger, uuid, driver))
    return devices, "; ".join(notes)


def _uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
