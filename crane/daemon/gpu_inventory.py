"""The host's real GPUs, as NVML (pynvml) reports them.

The daemon inventories GPUs with NVML rather than CUDA: NVML sees every board (also one whose
CUDA context would fail), reports what an operator asks about (utilization, MIG mode, driver
version, the physical UUID) and costs no CUDA context in the daemon. Workers open CUDA
themselves. Without NVML, a child process asks CUDA (``crane.backends.cuda.probe``) and the
live figures read as unknown.

Ordinals: the daemon exports ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` to its workers, so CUDA's device N
is NVML's device N (both in PCI bus order) and ``cuda:N`` means the same board to the operator,
``nvidia-smi`` and the worker.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GpuInfo",
    "GpuStatus",
    "GpuTelemetry",
    "NvmlUnavailable",
    "XidWatcher",
    "cuda_attributes",
    "gpu_lost",
    "gpu_status",
    "gpu_telemetry",
    "list_gpus",
]

log = logging.getLogger("craned")


class NvmlUnavailable(RuntimeError):
    """pynvml is missing or NVML cannot initialize (no driver)."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    total_mem: int
    cc: tuple[int, int]
    pci_bus_id: str
    driver_version: str
    #: Every device attribute, where CUDA gave the inventory (NVML does not know them).
    attributes: dict[int, int] | None = None


@dataclass(frozen=True)
class GpuStatus:
    utilization_pct: int  # -1 where NVML cannot say (e.g. a MIG parent)
    used_mem: int  # all processes on the board, not only Crane's
    mig_mode: str  # "enabled", "disabled" or "n/a"


_lock = threading.Lock()
_nvml: Any = None
_cuda_only = False  # the inventory came from CUDA: no live figures
_attributes: dict[int, dict[int, int]] = {}  # GPU index -> its attributes, from CUDA


def _load() -> Any:
    global _nvml
    with _lock:
        if _nvml is None:
            try:
                import pynvml  # type: ignore[import-not-found]
            except ImportError as e:
                raise NvmlUnavailable(f"pynvml (nvidia-ml-py) is not installed: {e}") from None
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as e:
                raise NvmlUnavailable(f"NVML cannot initialize: {e}") from None
            _nvml = pynvml
    return _nvml


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def list_gpus() -> list[GpuInfo]:
    """NVML's inventory, or CUDA's (in a child process) where NVML is not available."""
    try:
        nv = _load()
    except NvmlUnavailable as e:
        return _cuda_inventory(str(e))
    driver = _text(nv.nvmlSystemGetDriverVersion())
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
        out.append(
            GpuInfo(
                index=i,
                name=_text(nv.nvmlDeviceGetName(h)),
                uuid=_text(nv.nvmlDeviceGetUUID(h)),
                total_mem=int(mem.total),
                cc=(int(major), int(minor)),
                pci_bus_id=_text(nv.nvmlDeviceGetPciInfo(h).busId).lower(),
                driver_version=driver,
            )
        )
    return out


def _probe_cuda() -> dict[str, Any]:
    """CUDA's answer (``crane.backends.cuda.probe``, in a child process); ``{"error": ...}``
    when it cannot give one."""
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "crane.backends.cuda.probe"],
            capture_output=True,
            timeout=120,
            env=env,
            check=False,
        )
        answer = json.loads(done.stdout or b"{}")
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        return {"error": f"the CUDA probe failed: {e}"}
    if "error" not in answer and "gpus" not in answer:
        answer = {"error": done.stderr.decode(errors="replace")[-300:]}
    return answer


def _gpu(g: dict[str, Any]) -> GpuInfo:
    return GpuInfo(
        index=g["index"],
        name=g["name"],
        uuid=g["uuid"],
        total_mem=g["total_mem"],
        cc=(g["cc"][0], g["cc"][1]),
        pci_bus_id=g["pci_bus_id"],
        driver_version=g["driver_version"],
        attributes={int(k): int(v) for k, v in g.get("attributes", {}).items()},
    )


def _cuda_inventory(nvml_error: str) -> list[GpuInfo]:
    answer = _probe_cuda()
    if "error" in answer:
        raise NvmlUnavailable(f"{nvml_error}; CUDA: {answer['error']}")
    global _cuda_only
    _cuda_only = True
    gpus = [_gpu(g) for g in answer["gpus"]]
    with _lock:
        _attributes.update({g.index: g.attributes for g in gpus if g.attributes})
    return gpus


def cuda_attributes(index: int) -> dict[int, int]:
    """Every attribute CUDA reports for GPU ``index`` (NVML does not know them): asked once,
    in a child process, so the daemon never holds a CUDA context. ``NvmlUnavailable`` (the
    inventory's error) when CUDA cannot answer."""
    with _lock:
        cached = _attributes.get(index)
    if cached is not None:
        return cached
    answer = _probe_cuda()
    if "error" in answer:
        raise NvmlUnavailable(f"CUDA cannot report GPU {index}'s attributes: {answer['error']}")
    found = {g.index: g.attributes or {} for g in map(_gpu, answer["gpus"])}
    with _lock:
        _attributes.update(found)
    if index not in found:
        raise NvmlUnavailable(f"CUDA reports no GPU {index}")
    return found[index]


def gpu_status(index: int) -> GpuStatus:
    """Live figures for ``crane devices``; unknown values rather than errors (a board can
    refuse single queries, e.g. utilization with MIG enabled)."""
    if _cuda_only:
        return GpuStatus(-1, 0, "n/a")
    nv = _load()
    h = nv.nvmlDeviceGetHandleByIndex(index)
    try:
        util = int(nv.nvmlDeviceGetUtilizationRates(h).gpu)
    except nv.NVMLError:
        util = -1
    try:
        current, _pending = nv.nvmlDeviceGetMigMode(h)
        mig = "enabled" if current else "disabled"
    except nv.NVMLError:
        mig = "n/a"
    try:
        used = int(nv.nvmlDeviceGetMemoryInfo(h).used)
    except nv.NVMLError:
        used = 0
    return GpuStatus(util, used, mig)


@dataclass(frozen=True)
class GpuTelemetry:
    """What the Prometheus exporter reports of a board, in DCGM exporter's units; None where
    NVML cannot say (the field is then not exported rather than invented)."""

    pci_bus_id: str
    utilization_pct: int | None
    fb_used_mib: float | None
    fb_free_mib: float | None
    power_w: float | None
    temp_c: int | None


def gpu_telemetry(index: int) -> GpuTelemetry:
    """Live figures of board ``index`` for the exporter (NVML; all None without it)."""
    if _cuda_only:
        return GpuTelemetry("", None, None, None, None, None)
    nv = _load()
    h = nv.nvmlDeviceGetHandleByIndex(index)

    def ask(fn: Any, *args: Any) -> Any:
        try:
            return fn(h, *args)
        except nv.NVMLError:
            return None

    pci = ask(nv.nvmlDeviceGetPciInfo)
    util = ask(nv.nvmlDeviceGetUtilizationRates)
    mem = ask(nv.nvmlDeviceGetMemoryInfo)
    power = ask(nv.nvmlDeviceGetPowerUsage)  # milliwatts
    temp = ask(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
    return GpuTelemetry(
        pci_bus_id=_text(pci.busId).lower() if pci is not None else "",
        utilization_pct=int(util.gpu) if util is not None else None,
        fb_used_mib=mem.used / 2**20 if mem is not None else None,
        fb_free_mib=mem.free / 2**20 if mem is not None else None,
        power_w=power / 1000.0 if power is not None else None,
        temp_c=int(temp) if temp is not None else None,
    )


class XidWatcher:
    """The last XID error of each board (DCGM_FI_DEV_XID_ERRORS is that value, 0 before any),
    from NVML's critical-XID events, followed by a thread for the daemon's life."""

    def __init__(self, indexes: list[int]) -> None:
        self.last: dict[int, int] = dict.fromkeys(indexes, 0)
        self.error = ""
        if not indexes or _cuda_only:
            self.error = "NVML unavailable"
            return
        try:
            nv = _load()
            self._set = nv.nvmlEventSetCreate()
            self._uuids = {}
            for i in indexes:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._set)
                self._uuids[_text(nv.nvmlDeviceGetUUID(h))] = i
        except (NvmlUnavailable, Exception) as e:  # a board or driver without events
            self.error = str(e)
            log.warning("XID errors will not be reported: %s", e)
            return
        threading.Thread(target=self._follow, daemon=True, name="xid-watch").start()

    def _follow(self) -> None:
        nv = _load()
        while True:
            try:
                ev = nv.nvmlEventSetWait_v2(self._set, 5000)
            except nv.NVMLError as e:
                if getattr(e, "value", None) == nv.NVML_ERROR_TIMEOUT:
                    continue
                log.warning("XID watch stopped: %s", e)
                return
            i = self._uuids.get(_text(nv.nvmlDeviceGetUUID(ev.device)))
            if i is not None:
                self.last[i] = int(ev.eventData)
                log.warning("GPU %d reported XID %d", i, ev.eventData)


def gpu_lost(index: int) -> str | None:
    """Why GPU ``index`` is gone (None: NVML still reaches it, or cannot tell): NVML's "GPU is
    lost" (fallen off the bus, an XID that needs a reset) or its board no longer found. Only
    those answers count: any other error (NVML busy, a query the board refuses) says nothing
    about the board being lost, and the daemon's health must not flap on it."""
    if _cuda_only:
        return None
    nv = _load()
    lost = {getattr(nv, "NVML_ERROR_GPU_IS_LOST", 15), getattr(nv, "NVML_ERROR_NOT_FOUND", 6)}
    try:
        nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(index))
    except nv.NVMLError as e:
        if getattr(e, "value", None) in lost:
            return f"GPU {index}: {e}"
    return None
