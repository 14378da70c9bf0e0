"""Init, driver version and device queries: answered from the session's device snapshot, taken
once at session open, so none of cudart's ~115 start-up queries crosses the wire."""

from __future__ import annotations

from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.interposer.registry import handles
from crane.interposer.runtime import RT

_DEVICE_COUNT = 1  # a session serves exactly one device


def _dev(dev: int) -> None:
    if not 0 <= dev < _DEVICE_COUNT:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_DEVICE, f"no device {dev}")


def _copy_str(dst: Any, length: int, text: str) -> None:
    if dst == RT.ffi.NULL or length <= 0:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "bad output buffer")
    raw = text.encode()[: length - 1] + b"\0"
    RT.ffi.memmove(dst, raw, len(raw))


@handles("cuInit@2000")
def cu_init(flags: int) -> None:
    if flags != 0:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "cuInit flags must be 0")
    RT.session()
    RT.initialized = True


@handles("cuDriverGetVersion@2020")
def driver_get_version(out: Any) -> None:
    RT.out(out, RT.session().driver_version)


@handles("cuDeviceGetCount@2000")
def device_get_count(out: Any) -> None:
    RT.require_init()
    RT.out(out, _DEVICE_COUNT)


@handles("cuDeviceGet@2000")
def device_get(out: Any, ordinal: int) -> None:
    RT.require_init()
    _dev(ordinal)
    RT.out(out, ordinal)


@handles("cuDeviceGetName@2000")
def device_get_name(name: Any, length: int, dev: int) -> None:
    s = RT.require_init()
    _dev(dev)
    _copy_str(name, length, s.device.name)


@handles("cuDeviceTotalMem@3020")
def device_total_mem(out: Any, dev: int) -> None:
    s = RT.require_init()
    _dev(dev)
    RT.out(out, s.device.total_mem)


@handles("cuDeviceGetAttribute@2000")
def device_get_attribute(out: Any, attrib: int, dev: int) -> None:
    s = RT.require_init()
    _dev(dev)
    value = s.attributes.get(attrib)
    if value is None:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"unknown device attribute {attrib}")
    RT.out(out, value)


@handles("cuDeviceGetUuid@9020", "cuDeviceGetUuid@11040")
def device_get_uuid(out: Any, dev: int) -> None:
    s = RT.require_init()
    _dev(dev)
    if out == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL uuid")
    RT.ffi.memmove(out, s.device.uuid[:16].ljust(16, b"\0"), 16)


@handles("cuDeviceGetPCIBusId@4010")
def device_get_pci_bus_id(buf: Any, length: int, dev: int) -> None:
    s = RT.require_init()
    _dev(dev)
    _copy_str(buf, length, s.device.pci_bus_id)


@handles("cuDeviceGetByPCIBusId@4010")
def device_get_by_pci_bus_id(out: Any, bus_id: Any) -> None:
    s = RT.require_init()
    wanted = RT.ffi.string(bus_id).decode().lower()
    if wanted != s.device.pci_bus_id.lower():
        raise CudaError(CUresult.CUDA_ERROR_INVALID_DEVICE, f"no device at {wanted}")
    RT.out(out, 0)


@handles("cuDeviceComputeCapability@2000")
def device_compute_capability(major: Any, minor: Any, dev: int) -> None:
    s = RT.require_init()
    _dev(dev)
    RT.out(major, s.device.cc[0])
    RT.out(minor, s.device.cc[1])


# ---- peers: a session serves one device, which is no peer of itself -------------------------
# The answers a single-GPU machine gives, so that multi-GPU code paths are skipped cleanly.


@handles("cuDeviceCanAccessPeer@4000")
def device_can_access_peer(out: Any, dev: int, peer: int) -> None:
    _dev(dev)
    _dev(peer)
    RT.out(out, 0)


@handles("cuDeviceGetP2PAttribute@8000")
def device_get_p2p_attribute(out: Any, attrib: int, src: int, dst: int) -> None:
    _dev(src)
    _dev(dst)
    raise CudaError(
        CUresult.CUDA_ERROR_INVALID_DEVICE, f"P2P attribute {attrib} of device {src} with itself"
    )


@handles("cuCtxEnablePeerAccess@4000")
def ctx_enable_peer_access(peer_ctx: Any, flags: int) -> None:
    if flags != 0:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "peer access flags must be 0")
    if peer_ctx == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_CONTEXT, "NULL peer context")
    RT.ctx(peer_ctx)
    raise CudaError(
        CUresult.CUDA_ERROR_INVALID_DEVICE,
        "the peer context is on this context's own device (a session serves one device)",
    )


@handles("cuCtxDisablePeerAccess@4000")
def ctx_disable_peer_access(peer_ctx: Any) -> None:
    if peer_ctx == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_CONTEXT, "NULL peer context")
    RT.ctx(peer_ctx)
    raise CudaError(CUresult.CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access was never enabled")
