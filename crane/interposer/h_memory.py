"""Device memory: allocation, every linear copy, memsets, stream-ordered allocation.

Device pointers are guest-chosen addresses inside the session's VA window, so "is this a device
pointer" (for ``cuMemcpy`` and copies with unified addressing) is a local range check. Host
memory, pinned or not, is plain guest memory: copies read or fill it through the session. A
device-to-host copy waits for its data (it must land before the call, or before the stream's
next synchronization, returns: waiting early is never wrong)."""

from __future__ import annotations

from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.guest.session import GuestSession
from crane.interposer import graphs
from crane.interposer.h_pools import free_now
from crane.interposer.registry import handles
from crane.interposer.runtime import RT


def is_device(s: GuestSession, addr: int) -> bool:
    base, size = s.va_window
    return base <= addr < base + size


def host_view(addr: int, n: int) -> Any:
    if addr == 0 and n:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL host pointer")
    return RT.ffi.buffer(RT.ffi.cast("char *", addr), n)


def copy(dst: int, src: int, n: int, stream: int) -> None:
    """Copy n bytes between any two guest-visible addresses, in stream order."""
    if n == 0:
        return
    s = RT.session()
    d_dev, s_dev = is_device(s, dst), is_device(s, src)
    if d_dev and s_dev:
        s.memcpy_dtod(dst, src, n, stream)
    elif d_dev:
        s.memcpy_htod(dst, host_view(src, n), stream)
    elif s_dev:
        s.memcpy_dtoh(src, n, stream, out=host_view(dst, n))
    else:
        RT.ffi.memmove(RT.ffi.cast("char *", dst), RT.ffi.cast("char *", src), n)


def sync_call(what: str) -> int:
    """A synchronous call on the default stream: refused during capture where CUDA refuses
    it (a potentially unsafe call, or an implicit wait on a capturing stream). Returns the
    default stream."""
    stream = RT.stream(RT.ffi.NULL)
    graphs.check_unsafe(what)
    graphs.check_sync(stream, what)
    return stream


def captured_copy(dst: int, src: int, n: int, stream: int) -> bool:
    """Record a linear copy if ``stream`` is capturing (True)."""
    return graphs.record(stream, graphs.MEMCPY, graphs.CopyParams(dst, src, n))


def captured_memset(dst: int, value: int, elem: int, n: int, stream: int) -> bool:
    return graphs.record(
        stream, graphs.MEMSET, graphs.MemsetParams(dst, elem * n, value, elem, n, 1)
    )


@handles("cuMemAlloc@3020")
def mem_alloc(out: Any, size: int) -> None:
    graphs.check_unsafe("cuMemAlloc")
    if out == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL dptr")
    out[0] = RT.session().mem_alloc(size, RT.ctx())


@handles("cuMemFree@3020")
def mem_free(dptr: int) -> None:
    """Also frees stream-ordered and graph allocations, each its own way (h_pools.free_now)."""
    graphs.check_unsafe("cuMemFree")
    free_now(dptr, 0)


@handles("cuMemGetInfo@3020")
def mem_get_info(free: Any, total: Any) -> None:
    f, t = RT.session().mem_get_info()
    RT.out(free, f)
    RT.out(total, t)


@handles("cuMemAllocPitch@3020")
def mem_alloc_pitch(out: Any, pitch: Any, width: int, height: int, elem: int) -> None:
    graphs.check_unsafe("cuMemAllocPitch")
    if elem not in (4, 8, 16) or width == 0 or height == 0:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "bad pitch allocation request")
    p = (width + 511) // 512 * 512  # the driver's texture pitch alignment
    out[0] = RT.session().mem_alloc(p * height, RT.ctx())
    RT.out(pitch, p)


@handles("cuMemGetAddressRange@3020")
def mem_get_address_range(pbase: Any, psize: Any, dptr: int) -> None:
    hit = RT.session().va.lookup(dptr)  # an allocation, or a VMM mapping
    if hit is None or dptr >= hit[0] + hit[1]:
        raise CudaError(CUresult.CUDA_ERROR_NOT_FOUND, f"{dptr:#x} is not in an allocation")
    if pbase != RT.ffi.NULL:
        pbase[0] = hit[0]
    if psize != RT.ffi.NULL:
        psize[0] = hit[1]


# ---- linear copies -------------------------------------------------------------------------
@handles("cuMemcpy@4000")
def memcpy(dst: int, src: int, n: int) -> None:
    copy(dst, src, n, sync_call("cuMemcpy"))


@handles("cuMemcpyAsync@4000")
def memcpy_async(dst: int, src: int, n: int, stream: Any) -> None:
    s = RT.stream(stream)
    if not captured_copy(dst, src, n, s):
        copy(dst, src, n, s)


@handles("cuMemcpyHtoD@3020")
def memcpy_htod(dst: int, src: Any, n: int) -> None:
    stream = sync_call("cuMemcpyHtoD")
    if n:
        RT.session().memcpy_htod(dst, RT.ffi.buffer(src, n), stream)


@handles("cuMemcpyHtoDAsync@3020")
def memcpy_htod_async(dst: int, src: Any, n: int, stream: Any) -> None:
    if captured_copy(dst, RT.ptr(src), n, RT.stream(stream)):
        return
    if n:
        RT.session().memcpy_htod(dst, RT.ffi.buffer(src, n), RT.stream(stream))


@handles("cuMemcpyDtoH@3020")
def memcpy_dtoh(dst: Any, src: int, n: int) -> None:
    stream = sync_call("cuMemcpyDtoH")
    if n:
        RT.session().memcpy_dtoh(src, n, stream, out=RT.ffi.buffer(dst, n))


@handles("cuMemcpyDtoHAsync@3020")
def memcpy_dtoh_async(dst: Any, src: int, n: int, stream: Any) -> None:
    if captured_copy(RT.ptr(dst), src, n, RT.stream(stream)):
        return
    if n:
        RT.session().memcpy_dtoh(src, n, RT.stream(stream), out=RT.ffi.buffer(dst, n))


@handles("cuMemcpyDtoD@3020")
def memcpy_dtod(dst: int, src: int, n: int) -> None:
    stream = sync_call("cuMemcpyDtoD")
    if n:
        RT.session().memcpy_dtod(dst, src, n, stream)


@handles("cuMemcpyDtoDAsync@3020")
def memcpy_dtod_async(dst: int, src: int, n: int, stream: Any) -> None:
    if captured_copy(dst, src, n, RT.stream(stream)):
        return
    if n:
        RT.session().memcpy_dtod(dst, src, n, RT.stream(stream))


# ---- 2D and 3D copies (arrays among their endpoints): crane.interposer.h_copy --------------


# ---- memsets ---------------------------------------------------------------------------------
@handles("cuMemsetD8@3020")
def memset_d8(dst: int, value: int, n: int) -> None:
    stream = RT.stream(RT.ffi.NULL)
    if not captured_memset(dst, value, 1, n, stream):
        RT.session().memset_d8(dst, value, n, stream)


@handles("cuMemsetD16@3020")
def memset_d16(dst: int, value: int, n: int) -> None:
    stream = RT.stream(RT.ffi.NULL)
    if not captured_memset(dst, value, 2, n, stream):
        RT.session().memset_d16(dst, value, n, stream)


@handles("cuMemsetD32@3020")
def memset_d32(dst: int, value: int, n: int) -> None:
    stream = RT.stream(RT.ffi.NULL)
    if not captured_memset(dst, value, 4, n, stream):
        RT.session().memset_d32(dst, value, n, stream)


@handles("cuMemsetD8Async@3020")
def memset_d8_async(dst: int, value: int, n: int, stream: Any) -> None:
    s = RT.stream(stream)
    if not captured_memset(dst, value, 1, n, s):
        RT.session().memset_d8(dst, value, n, s)


@handles("cuMemsetD16Async@3020")
def memset_d16_async(dst: int, value: int, n: int, stream: Any) -> None:
    s = RT.stream(stream)
    if not captured_memset(dst, value, 2, n, s):
        RT.session().memset_d16(dst, value, n, s)


@handles("cuMemsetD32Async@3020")
def memset_d32_async(dst: int, value: int, n: int, stream: Any) -> None:
    s = RT.stream(stream)
    if not captured_memset(dst, value, 4, n, s):
        RT.session().memset_d32(dst, value, n, s)
