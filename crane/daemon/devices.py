"""The devices a daemon serves, chosen from its ``backend`` settings.

``auto`` means the first real GPU when NVML finds one and the cuda backend can run (cuda-python
installed), else the simulated H100; the choice and its reason are logged, because an operator
who expected a GPU must be able to see why a session runs on the simulator.

A :class:`Device` is neutral: whatever backend drives it, it says what the device *reports*
(name, memory, compute capability and, for a pre-flight, every attribute), so a restore or an
incoming migration is checked against the device itself, never against a simulator profile.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from crane.backends.catalog import (
    DEFAULT_MODEL_KEY,
    UnknownModelError,
    builtin_model,
    builtin_model_keys,
    cuda_unavailable,
)
from crane.daemon.gpu_inventory import GpuInfo, NvmlUnavailable, cuda_attributes, list_gpus
from crane.device.identity import uuid_text
from crane.device.ledger import Ledger
from crane.device.model import DeviceModel
from crane.device.model_file import ModelFileError, read_model_file
from crane.device.presented import present, promises_more
from crane.modules.arch import format_cc
from crane.state.preflight import Destination

__all__ = ["DEFAULT_SIM_PROFILE", "Device", "resolve_devices"]

log = logging.getLogger("craned")

DEFAULT_SIM_PROFILE = DEFAULT_MODEL_KEY


@dataclass
class Device:
    index: int
    backend: str  # "sim" or "cuda"
    #: What the session worker's backend opens: a simulator profile key, or the CUDA ordinal.
    arg: str
    name: str
    total_mem: int
    cc: tuple[int, int]
    ledger: Ledger
    uuid: str
    driver_version: str = "crane-sim"
    #: How to learn every attribute the device reports (asked once, when first needed).
    read_attributes: Callable[[], dict[int, int]] = field(default=dict, repr=False)
    _attributes: dict[int, int] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: The model its guests are told (``--backend SPEC@MODEL``; memory already clipped to the
    #: device's), or None: the device's own identity.
    model: DeviceModel | None = None

    @property
    def model_key(self) -> str:
        """The presented model's key ("" when guests are told the device itself)."""
        return self.model.key if self.model is not None else ""

    @property
    def offered_total(self) -> int:
        """Device memory its guests may use: the presented model's total, else the device's."""
        return self.model.total_mem if self.model is not None else self.total_mem

    @property
    def offered_attributes(self) -> dict[int, int]:
        """The limits its guests are held to: the presented model's, else the device's."""
        return dict(self.model.attributes) if self.model is not None else self.attributes

    @property
    def offered_cc(self) -> tuple[int, int]:
        return self.model.compute_capability if self.model is not None else self.cc

    @property
    def ledger_path(self) -> str:
        return str(self.ledger.path)

    @property
    def label(self) -> str:
        """How refusals and logs name the device's model: ``h200``, ``cuda:0 NVIDIA H100``."""
        return self.arg if self.backend == "sim" else f"{self.backend}:{self.arg} {self.name}"

    @property
    def attributes(self) -> dict[int, int]:
        """Every attribute the device reports, as its own backend reads them."""
        with self._lock:
            if self._attributes is None:
                self._attributes = dict(self.read_attributes())
            return self._attributes

    def destination(self) -> Destination:
        """The device as a pre-flight sees it (restores and incoming migrations alike)."""
        label = self.label + (f" as {self.model_key}" if self.model is not None else "")
        return Destination(
            where=f"device {self.index} ({label}, {format_cc(self.offered_cc)})",
            cc=self.offered_cc,
            attributes=self.offered_attributes,
            free_mem=self.offered_total - self.ledger.used(),
        )


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
    return cuda_unavailable()


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


def _gpu_attributes(gpu: GpuInfo) -> Callable[[], dict[int, int]]:
    """The GPU's attributes: from the inventory when CUDA gave it, else asked of CUDA."""
    if gpu.attributes:
        known = dict(gpu.attributes)
        return lambda: known
    return lambda: cuda_attributes(gpu.index)


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

    for full_spec in specs:
        spec, _, model_arg = full_spec.partition("@")
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
        ledger_path = run_dir / f"device{index}.ledger"
        if kind == "cuda":
            gpus, why, missing = probe()
            if not gpus or missing:
                raise ValueError(f"backend {spec!r}: {missing or why}")
            gpu = _pick_gpu(gpus, arg, spec)
            # CUDA numbers devices fastest-first by default; workers must agree with NVML.
            os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            device = Device(
                index=index,
                backend="cuda",
                arg=str(gpu.index),
                name=gpu.name,
                total_mem=gpu.total_mem,
                cc=gpu.cc,
                ledger=Ledger(ledger_path, gpu.total_mem),
                uuid=gpu.uuid,
                driver_version=gpu.driver_version,
                read_attributes=_gpu_attributes(gpu),
            )
            notes.append(f"device {index}: cuda:{gpu.index} ({gpu.name}, {gpu.pci_bus_id})")
        elif kind == "sim":
            model = builtin_model(arg or DEFAULT_SIM_PROFILE)
            device = Device(
                index=index,
                backend="sim",
                arg=model.key,
                name=model.name,
                total_mem=model.total_mem,
                cc=model.compute_capability,
                ledger=Ledger(ledger_path, model.total_mem),
                uuid=uuid_text(model.uuid_for(f"device{index}".encode())),
                read_attributes=lambda m=model: dict(m.attributes),
            )
            notes.append(f"device {index}: sim:{model.key} ({model.name})")
        else:
            raise ValueError(f"unknown backend {spec!r}: use auto, cuda[:N] or sim:PROFILE")
        if model_arg:
            device.model = _presented(device, model_arg, full_spec)
            device.ledger = Ledger(ledger_path, device.model.total_mem)
            notes[-1] += f" as {device.model.key} ({device.model.name})"
        device.ledger.reset()
        devices.append(device)
    return devices, "; ".join(notes)


def _load_model(arg: str, cc: tuple[int, int], spec: str) -> DeviceModel:
    """``MODEL`` of ``SPEC@MODEL``: a built-in model's key, or a model file's path."""
    try:
        return builtin_model(arg)
    except UnknownModelError:
        pass
    if "/" not in arg and not arg.endswith(".toml") and not Path(arg).exists():
        raise ValueError(
            f"backend {spec!r}: no model {arg!r}: not a built-in model "
            f"({', '.join(builtin_model_keys())}) nor a model file"
        )
    try:
        return read_model_file(arg, default_cc=cc)
    except ModelFileError as e:
        raise ValueError(f"backend {spec!r}: {e}") from None


def _presented(device: Device, arg: str, spec: str) -> DeviceModel:
    """The model ``device`` presents, refused when it promises more than the device has."""
    model = _load_model(arg, device.cc, spec)
    why = promises_more(model, device.attributes, device.cc, simulated=device.backend == "sim")
    if why:
        raise ValueError(
            f"backend {spec!r}: model {model.key} promises more than {device.label} has: "
            + "; ".join(why)
        )
    return present(model, device.total_mem)
