"""Host memory kernels reach (mapped pinned memory) and managed memory.

Both are mirrored device memory kept coherent at synchronization points
(:mod:`crane.guest.mirror`); the session is told ``CONCURRENT_MANAGED_ACCESS = 0`` and
``CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 0`` (:mod:`crane.device.served`), the documented
model this serves. Pinned memory without ``DEVICEMAP`` stays plain guest memory (the C side,
interposer/src/hostmem.c): mirroring every staging buffer would read it back at every
synchronization. Advice and prefetch locations are recorded and answered; prefetching to the
device sends the host's changes at once, in the stream.
"""

from __future__ import annotations

import struct
from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.guest.mirror import Mirror
from crane.interposer import graphs
from crane.interposer.registry import handles
from crane.interposer.runtime import RT

_HOSTALLOC_PORTABLE, _HOSTALLOC_DEVICEMAP, _HOSTALLOC_WRITECOMBINED = 1, 2, 4
_REGISTER_PORTABLE, _REGISTER_DEVICEMAP, _REGISTER_IOMEMORY, _REGISTER_READ_ONLY = 1, 2, 4, 8
_REGISTER_FLAGS = (
    _REGISTER_PORTABLE | _REGISTER_DEVICEMAP | _REGISTER_IOMEMORY | _REGISTER_READ_ONLY
)
_ATTACH_GLOBAL, _ATTACH_HOST, _ATTACH_SINGLE = 1, 2, 4
_DEVICE_CPU, _DEVICE_INVALID = -1, -2
# CUmem_advise
_READ_MOSTLY, _UNSET_READ_MOSTLY, _PREFERRED, _UNSET_PREFERRED, _ACCESSED_BY, _UNSET_ACCESSED = (
    1, 2, 3, 4, 5, 6,
)  # fmt: skip
# CUmem_range_attribute
_R_READ_MOSTLY, _R_PREFERRED, _R_ACCESSED_BY, _R_LAST_PREFETCH = 1, 2, 3, 4
_R_PREFERRED_TYPE, _R_PREFERRED_ID, _R_LAST_PREFETCH_TYPE, _R_LAST_PREFETCH_ID = 5, 6, 7, 8
_LOC_INVALID, _LOC_DEVICE, _LOC_HOST = 0, 1, 2


def _check_result(rc: int, what: str) -> None:
    if rc:
        raise CudaError(CUresult(rc), what)


# ---- mapped pinned memory --------------------------------------------------------------------
@handles("cuMemHostAlloc@2020")
def mem_host_alloc(pp: Any, size: int, flags: int) -> None:
    if pp == RT.ffi.NULL or size == 0:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL pointer or zero size")
    if flags & ~(_HOSTALLOC_PORTABLE | _HOSTALLOC_DEVICEMAP | _HOSTALLOC_WRITECOMBINED):
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad cuMemHostAlloc flags {flags:#x}")
    if not flags & _HOSTALLOC_DEVICEMAP:
        _check_result(RT.lib.crane_c_cuMemHostAlloc_2020(pp, size, flags), "cuMemHostAlloc")
        return
    s = RT.session()
    addr = s.mirror_shared(size, "mapped", flags)
    if RT.lib.crane_host_add(RT.ffi.cast("void *", addr), size, flags):
        m = s.mirrors.by_dev(addr)
        assert m is not None
        s.mirror_release(m)
        raise CudaError(CUresult.CUDA_ERROR_OUT_OF_MEMORY, "cannot record the host block")
    pp[0] = RT.ffi.cast("void *", addr)


def _mirror_at(p: int, kind: str) -> Mirror | None:
    """The mirrored block of ``kind`` that starts at host address ``p`` (no session opened
    just to look)."""
    if not RT.has_session:
        return None
    m = RT.session().mirrors.by_host(p)
    return m if m is not None and m.host == p and m.kind == kind else None


@handles("cuMemFreeHost@2000")
def mem_free_host(p: Any) -> None:
    m = _mirror_at(RT.ptr(p), "mapped")
    if m is None:
        _check_result(RT.lib.crane_c_cuMemFreeHost_2000(p), "not host memory from cuMemHostAlloc")
        return
    RT.session().mirror_release(m)
    RT.lib.crane_host_remove(p)


@handles("cuMemHostRegister@6050")
def mem_host_register(p: Any, size: int, flags: int) -> None:
    if flags & ~_REGISTER_FLAGS:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad host register flags {flags:#x}")
    if flags & _REGISTER_IOMEMORY:
        raise CudaError(CUresult.CUDA_ERROR_NOT_SUPPORTED, "registering I/O memory (no local GPU)")
    if flags & _REGISTER_READ_ONLY:
        raise CudaError(CUresult.CUDA_ERROR_NOT_SUPPORTED, "read-only registration")
    _check_result(RT.lib.crane_c_cuMemHostRegister_6050(p, size, flags), "cuMemHostRegister")
    if flags & _REGISTER_DEVICEMAP:
        try:
            RT.session().mirror_register(RT.ptr(p), size, flags)
        except CudaError:
            RT.lib.crane_c_cuMemHostUnregister_4000(p)
            raise


@handles("cuMemHostUnregister@4000")
def mem_host_unregister(p: Any) -> None:
    m = _mirror_at(RT.ptr(p), "registered")
    if m is not None:
        RT.session().mirror_release(m)
    _check_result(RT.lib.crane_c_cuMemHostUnregister_4000(p), "not registered host memory")


@handles("cuMemHostGetDevicePointer@3020")
def mem_host_get_device_pointer(out: Any, p: Any, flags: int) -> None:
    if out == RT.ffi.NULL or flags != 0:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL output or non-zero flags")
    addr = RT.ptr(p)
    s = RT.session()
    m = s.mirrors.by_host(addr) if s.mirrors else None
    if m is not None and m.kind != "managed":
        out[0] = m.dev + (addr - m.host)
        return
    if RT.lib.crane_host_lookup(p, RT.ffi.NULL, RT.ffi.NULL, RT.ffi.NULL):
        raise CudaError(
            CUresult.CUDA_ERROR_NOT_SUPPORTED,
            f"{addr:#x} is pinned without DEVICEMAP: kernels reach host memory here only when "
            "it is allocated or registered with CU_MEMHOSTALLOC_DEVICEMAP / "
            "CU_MEMHOSTREGISTER_DEVICEMAP (cudaHostAllocMapped / cudaHostRegisterMapped)",
        )
    raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"{addr:#x} is not page-locked host memory")


# ---- managed memory --------------------------------------------------------------------------
@handles("cuMemAllocManaged@6000")
def mem_alloc_managed(out: Any, size: int, flags: int) -> None:
    if out == RT.ffi.NULL or size == 0:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL pointer or zero size")
    if flags not in (_ATTACH_GLOBAL, _ATTACH_HOST):
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad managed flags {flags:#x}")
    graphs.check_unsafe("cuMemAllocManaged")
    out[0] = RT.session().mirror_shared(size, "managed", flags)


def _managed(ptr: int, count: int, what: str) -> Mirror:
    s = RT.session()
    m = s.mirrors.by_dev(ptr) if s.mirrors else None
    if m is None or m.kind != "managed" or ptr + count > m.dev + m.size:
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_VALUE, f"{what}: {ptr:#x}+{count:#x} is not managed memory"
        )
    return m


def _device_or_cpu(dev: int, what: str) -> None:
    if dev not in (0, _DEVICE_CPU):
        raise CudaError(CUresult.CUDA_ERROR_INVALID_DEVICE, f"{what}: no device {dev}")


@handles("cuMemPrefetchAsync@8000")
def mem_prefetch_async(ptr: int, count: int, dev: int, stream: Any) -> None:
    """To the device: the host's changes are sent now, in the stream; to the host: the
    stream's next synchronization brings the device's changes back, as always."""
    m = _managed(ptr, count, "cuMemPrefetchAsync")
    _device_or_cpu(dev, "cuMemPrefetchAsync")
    s = RT.session()
    h = RT.stream(stream)
    s.check_stream(h)
    graphs.refuse(h, "cuMemPrefetchAsync")
    if dev == 0:
        s.push_mirrors(h, [m])
    m.last_prefetch = dev


@handles("cuMemAdvise@8000")
def mem_advise(ptr: int, count: int, advice: int, dev: int) -> None:
    m = _managed(ptr, count, "cuMemAdvise")
    if advice in (_READ_MOSTLY, _UNSET_READ_MOSTLY):
        m.advice[_R_READ_MOSTLY] = int(advice == _READ_MOSTLY)
        return
    _device_or_cpu(dev, "cuMemAdvise")
    if advice == _PREFERRED:
        m.advice[_R_PREFERRED] = dev
    elif advice == _UNSET_PREFERRED:
        m.advice.pop(_R_PREFERRED, None)
    elif advice == _ACCESSED_BY:
        m.advice[_R_ACCESSED_BY] = dev
    elif advice == _UNSET_ACCESSED:
        m.advice.pop(_R_ACCESSED_BY, None)
    else:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"unknown advice {advice}")


def _location(dev: int) -> tuple[int, int]:
    """A device ordinal (or CPU / invalid) as CUmemLocation (type, id)."""
    if dev == _DEVICE_CPU:
        return _LOC_HOST, 0
    if dev == _DEVICE_INVALID:
        return _LOC_INVALID, 0
    return _LOC_DEVICE, dev


def _range_attribute(m: Mirror, attr: int, size: int) -> bytes:
    preferred = m.advice.get(_R_PREFERRED, _DEVICE_INVALID)
    if attr == _R_ACCESSED_BY:
        if size % 4:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "ACCESSED_BY needs a multiple of 4")
        devs = [m.advice[_R_ACCESSED_BY]] if _R_ACCESSED_BY in m.advice else []
        devs += [_DEVICE_INVALID] * (size // 4 - len(devs))
        return struct.pack(f"<{size // 4}i", *devs[: size // 4])
    if size != 4:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"attribute {attr} takes 4 bytes")
    values = {
        _R_READ_MOSTLY: m.advice.get(_R_READ_MOSTLY, 0),
        _R_PREFERRED: preferred,
        _R_LAST_PREFETCH: m.last_prefetch,
        _R_PREFERRED_TYPE: _location(preferred)[0],
        _R_PREFERRED_ID: _location(preferred)[1],
        _R_LAST_PREFETCH_TYPE: _location(m.last_prefetch)[0],
        _R_LAST_PREFETCH_ID: _location(m.last_prefetch)[1],
    }
    if attr not in values:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"unknown range attribute {attr}")
    return struct.pack("<i", values[attr])


@handles("cuMemRangeGetAttribute@8000")
def mem_range_get_attribute(data: Any, size: int, attr: int, ptr: int, count: int) -> None:
    if data == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL data")
    raw = _range_attribute(_managed(ptr, count, "cuMemRangeGetAttribute"), attr, size)
    RT.ffi.memmove(RT.ffi.cast("char *", data), raw, len(raw))


@handles("cuMemRangeGetAttributes@8000")
def mem_range_get_attributes(
    data: Any, sizes: Any, attrs: Any, n: int, ptr: int, count: int
) -> None:
    if data == RT.ffi.NULL or sizes == RT.ffi.NULL or attrs == RT.ffi.NULL or n == 0:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL arrays or no attributes")
    m = _managed(ptr, count, "cuMemRangeGetAttributes")
    for i in range(n):
        raw = _range_attribute(m, attrs[i], sizes[i])
        RT.ffi.memmove(RT.ffi.cast("char *", data[i]), raw, len(raw))


@handles("cuStreamAttachMemAsync@6000")
def stream_attach_mem_async(stream: Any, ptr: int, length: int, flags: int) -> None:
    """Attaching managed memory to a stream narrows which kernels the host must wait for;
    coherence here happens at every synchronization, so it changes nothing but is checked."""
    if flags not in (_ATTACH_GLOBAL, _ATTACH_HOST, _ATTACH_SINGLE):
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad attach flags {flags:#x}")
    m = _managed(ptr, max(length, 1), "cuStreamAttachMemAsync")
    if length not in (0, m.size) and not (ptr == m.dev and length <= m.size):
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "attach the whole allocation")
    RT.session().check_stream(RT.stream(stream))
