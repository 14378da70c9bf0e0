"""Device memory: allocation, every linear copy, memsets, stream-ordered allocation.

Device pointers are guest-chosen addresses inside the session's VA window, or module variables'
addresses, so "is this a device pointer" (for ``cuMemcpy`` and copies with unified addressing)
is a local range check. Host
memory, pinned or not, is plain guest memory: copies read or fill it through the session. A
device-to-host copy waits for its data (it must land before the call, or before the stream's
next synchronization, returns: waiting early is never wrong).

With unified addressing (which sessions are told), page-locked host memory is addressable by
the copy engine at its host address whatever its flags: a device-to-device copy or a memset
may name it (XLA's autotuner memsets pinned buffers so). Such an operation waits for the
stream's earlier work and is done here, on the guest's own pages; kernels still reach host
memory only through DEVICEMAP blocks (crane.guest.mirror)."""

from __future__ import annotations

from typing import Any

import numpy as np

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.guest.session import GuestSession
from crane.interposer import graphs
from crane.interposer.fastlane import FAST
from crane.interposer.h_pools import free_now
from crane.interposer.registry import handles
from crane.interposer.runtime import RT


def is_device(s: GuestSession, addr: int) -> bool:
    return s.is_device_address(addr)


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
    if d_dev or s_dev:
        _device_copy(s, dst, src, n, stream, d_dev, s_dev)
    else:
        RT.ffi.memmove(RT.ffi.cast("char *", dst), RT.ffi.cast("char *", src), n)


def _device_copy(
    s: GuestSession, dst: int, src: int, n: int, stream: int, d_dev: bool, s_dev: bool
) -> None:
    """A copy with at least one endpoint in device memory, through the session."""
    if d_dev and s_dev:
        s.memcpy_dtod(dst, src, n, stream)
    elif d_dev:
        s.memcpy_htod(dst, host_view(src, n), stream)
    else:
        s.memcpy_dtoh(src, n, stream, out=host_view(dst, n))


def pinned_host(addr: int, n: int) -> bool:
    """Whether ``[addr, addr + n)`` lies in one page-locked block of guest memory (not a
    mirrored one: those are inside the device window)."""
    base, size = RT.ffi.new("void **"), RT.ffi.new("size_t *")
    if not RT.lib.crane_host_lookup(RT.ffi.cast("void *", addr), base, size, RT.ffi.NULL):
        return False
    return addr + n <= int(RT.ffi.cast("uintptr_t", base[0])) + size[0]


def _host_side(stream: int, what: str) -> None:
    """Before touching pinned host memory for a stream-ordered operation: refused in a
    capture (the graph would name guest memory the worker cannot reach), else the stream's
    earlier work is waited for."""
    if graphs.capture_of(stream) is not None:
        raise CudaError(
            CUresult.CUDA_ERROR_NOT_SUPPORTED, f"{what} of page-locked host memory in a capture"
        )
    RT.session().stream_synchronize(stream)


def sync_call(what: str) -> int:
    """A synchronous call on the default stream: refused during capture where CUDA refuses
    it (an implicit wait on a capturing stream, or a potentially unsafe call). Returns the
    default stream. The implicit wait is checked first: a synchronous copy on the legacy stream
    while a blocking stream captures in global mode fails with
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT on an H100 (driver 580), not _UNSUPPORTED."""
    stream = RT.stream(RT.ffi.NULL)
    graphs.check_sync(stream, what)
    graphs.check_unsafe(what)
    return stream


def captured_copy(dst: int, src: int, n: int, stream: int) -> bool:
    """Record a linear copy if ``stream`` is capturing (True). The node is made only while
    some stream captures (every ordinary copy comes through here)."""
    return bool(graphs.STREAMS) and graphs.record(
        stream, graphs.MEMCPY, graphs.CopyParams(dst, src, n)
    )


def captured_memset(dst: int, value: int, elem: int, n: int, stream: int) -> bool:
    """Record a memset if ``stream`` is capturing (True); the node only while one captures."""
    return bool(graphs.STREAMS) and captured_fill(
        graphs.MemsetParams(dst, elem * n, value, elem, n, 1), stream
    )


def captured_fill(node: graphs.MemsetParams, stream: int) -> bool:
    """Record a (1D or 2D) memset node if ``stream`` is capturing (True)."""
    return bool(graphs.STREAMS) and graphs.record(stream, graphs.MEMSET, node)


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
    g = FAST.gen()
    stream = sync_call("cuMemcpy")
    copy(dst, src, n, stream)
    if n:
        _teach_copy(g, dst, src, n, stream)


@handles("cuMemcpyAsync@4000")
def memcpy_async(dst: int, src: int, n: int, stream: Any) -> None:
    g = FAST.gen()
    s = RT.stream(stream)
    if not captured_copy(dst, src, n, s):
        copy(dst, src, n, s)
        if n:
            _teach_copy(g, dst, src, n, s)


@handles("cuMemcpyHtoD@3020")
def memcpy_htod(dst: int, src: Any, n: int) -> None:
    stream = sync_call("cuMemcpyHtoD")
    if n:
        engine_copy(dst, RT.ptr(src), n, stream, "cuMemcpyHtoD", device=(True, False))


@handles("cuMemcpyHtoDAsync@3020")
def memcpy_htod_async(dst: int, src: Any, n: int, stream: Any) -> None:
    if captured_copy(dst, RT.ptr(src), n, RT.stream(stream)):
        return
    if n:
        engine_copy(
            dst, RT.ptr(src), n, RT.stream(stream), "cuMemcpyHtoDAsync", device=(True, False)
        )


@handles("cuMemcpyDtoH@3020")
def memcpy_dtoh(dst: Any, src: int, n: int) -> None:
    stream = sync_call("cuMemcpyDtoH")
    if n:
        engine_copy(RT.ptr(dst), src, n, stream, "cuMemcpyDtoH", device=(False, True))


@handles("cuMemcpyDtoHAsync@3020")
def memcpy_dtoh_async(dst: Any, src: int, n: int, stream: Any) -> None:
    if captured_copy(RT.ptr(dst), src, n, RT.stream(stream)):
        return
    if n:
        engine_copy(
            RT.ptr(dst), src, n, RT.stream(stream), "cuMemcpyDtoHAsync", device=(False, True)
        )


def engine_copy(
    dst: int, src: int, n: int, stream: int, what: str, device: tuple[bool, bool]
) -> None:
    """A copy whose endpoints marked in ``device`` (dst, src) the call names as device memory.
    Under unified addressing such an endpoint may be page-locked host memory: it is then read
    or written here, and when neither endpoint is device memory the copy is done here, after
    the stream's earlier work. Anything else goes to the device, which judges it."""
    s = RT.session()
    dst_dev = device[0] and (is_device(s, dst) or not pinned_host(dst, n))
    src_dev = device[1] and (is_device(s, src) or not pinned_host(src, n))
    if dst_dev or src_dev:
        _device_copy(s, dst, src, n, stream, dst_dev, src_dev)
    else:
        _host_side(stream, what)
        RT.ffi.memmove(RT.ffi.cast("char *", dst), RT.ffi.cast("char *", src), n)


@handles("cuMemcpyDtoD@3020")
def memcpy_dtod(dst: int, src: int, n: int) -> None:
    g = FAST.gen()
    stream = sync_call("cuMemcpyDtoD")
    if n:
        engine_copy(dst, src, n, stream, "cuMemcpyDtoD", device=(True, True))
        _teach_copy(g, dst, src, n, stream)


@handles("cuMemcpyDtoDAsync@3020")
def memcpy_dtod_async(dst: int, src: int, n: int, stream: Any) -> None:
    g = FAST.gen()
    if captured_copy(dst, src, n, RT.stream(stream)):
        return
    if n:
        engine_copy(dst, src, n, RT.stream(stream), "cuMemcpyDtoDAsync", device=(True, True))
        _teach_copy(g, dst, src, n, RT.stream(stream))


def _teach_copy(g: int, dst: int, src: int, n: int, stream: int) -> None:
    """After a device-to-device copy served here: the C fast lane may take the next ones
    between the same allocations (crane.interposer.fastlane), when both ends were device
    memory (not page-locked host memory under unified addressing)."""
    s = RT.session()
    if graphs.fast_ok() and is_device(s, dst) and is_device(s, src):
        FAST.learn(g, s, stream, dst, n)
        FAST.learn(g, s, stream, src, n)


def _peer_contexts(*ctxs: Any) -> None:
    """Both contexts of a peer copy must be valid ones (NULL included: CUDA names them)."""
    for c in ctxs:
        if c == RT.ffi.NULL:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_CONTEXT, "NULL context in a peer copy")
        RT.ctx(c)


@handles("cuMemcpyPeer@4000")
def memcpy_peer(dst: int, dst_ctx: Any, src: int, src_ctx: Any, n: int) -> None:
    """Between contexts of the session's one device: a device-to-device copy (unified
    addressing makes every address unique)."""
    _peer_contexts(dst_ctx, src_ctx)
    memcpy_dtod(dst, src, n)


@handles("cuMemcpyPeerAsync@4000")
def memcpy_peer_async(dst: int, dst_ctx: Any, src: int, src_ctx: Any, n: int, stream: Any) -> None:
    _peer_contexts(dst_ctx, src_ctx)
    memcpy_dtod_async(dst, src, n, stream)


# ---- 2D and 3D copies (arrays among their endpoints): crane.interposer.h_copy --------------


# ---- memsets ---------------------------------------------------------------------------------
_ELEMENT = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def memset(dst: int, value: int, elem: int, n: int, stream: int, what: str) -> None:
    """A memset of ``n`` elements of ``elem`` bytes: captured, done by the device, or (pinned
    host memory under unified addressing) done here after the stream's earlier work. A device
    memset done teaches the C fast lane its allocation and stream (crane.interposer.fastlane),
    so the next ones there need no Python."""
    g = FAST.gen()
    session = RT.session()
    if n and not is_device(session, dst) and pinned_host(dst, elem * n):
        _host_side(stream, what)
        buf = RT.ffi.buffer(RT.ffi.cast("char *", dst), elem * n)
        np.frombuffer(buf, dtype=_ELEMENT[elem])[:] = value & ((1 << (8 * elem)) - 1)
        return
    if not captured_memset(dst, value, elem, n, stream):
        getattr(session, f"memset_d{8 * elem}")(dst, value, n, stream)
        if graphs.fast_ok():
            FAST.learn(g, session, stream, dst, elem * n)


@handles("cuMemsetD8@3020")
def memset_d8(dst: int, value: int, n: int) -> None:
    memset(dst, value, 1, n, RT.stream(RT.ffi.NULL), "cuMemsetD8")


@handles("cuMemsetD16@3020")
def memset_d16(dst: int, value: int, n: int) -> None:
    memset(dst, value, 2, n, RT.stream(RT.ffi.NULL), "cuMemsetD16")


@handles("cuMemsetD32@3020")
def memset_d32(dst: int, value: int, n: int) -> None:
    memset(dst, value, 4, n, RT.stream(RT.ffi.NULL), "cuMemsetD32")


@handles("cuMemsetD8Async@3020")
def memset_d8_async(dst: int, value: int, n: int, stream: Any) -> None:
    memset(dst, value, 1, n, RT.stream(stream), "cuMemsetD8Async")


@handles("cuMemsetD16Async@3020")
def memset_d16_async(dst: int, value: int, n: int, stream: Any) -> None:
    memset(dst, value, 2, n, RT.stream(stream), "cuMemsetD16Async")


@handles("cuMemsetD32Async@3020")
def memset_d32_async(dst: int, value: int, n: int, stream: Any) -> None:
    memset(dst, value, 4, n, RT.stream(stream), "cuMemsetD32Async")


def memset_2d(
    dst: int, pitch: int, value: int, elem: int, size: tuple[int, int], stream: int, what: str
) -> None:
    """``cuMemsetD2D*``: ``size`` = (width in elements, height in rows), the rows ``pitch``
    bytes apart; one node while the stream captures, one fill where the rows are contiguous,
    else a fill per row (each as :func:`memset` does it)."""
    width, height = size
    if not width or not height:
        return
    if height > 1 and pitch < width * elem:
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_VALUE,
            f"{what}: pitch {pitch} is smaller than a row of {width * elem} bytes",
        )
    node = graphs.MemsetParams(dst, pitch, value, elem, width, height)
    if captured_fill(node, stream):
        return
    for start, n in memset_rows(node):
        memset(start, value, elem, n, stream, what)


def memset_rows(p: graphs.MemsetParams) -> list[tuple[int, int]]:
    """(address, elements) of each fill a 2D memset takes: one where its rows are contiguous."""
    if p.height == 1 or p.pitch == p.width * p.elem:
        return [(p.dst, p.width * p.height)]
    return [(p.dst + r * p.pitch, p.width) for r in range(p.height)]


@handles("cuMemsetD2D8@3020")
def memset_d2d8(dst: int, pitch: int, value: int, width: int, height: int) -> None:
    memset_2d(dst, pitch, value, 1, (width, height), RT.stream(RT.ffi.NULL), "cuMemsetD2D8")


@handles("cuMemsetD2D16@3020")
def memset_d2d16(dst: int, pitch: int, value: int, width: int, height: int) -> None:
    memset_2d(dst, pitch, value, 2, (width, height), RT.stream(RT.ffi.NULL), "cuMemsetD2D16")


@handles("cuMemsetD2D32@3020")
def memset_d2d32(dst: int, pitch: int, value: int, width: int, height: int) -> None:
    memset_2d(dst, pitch, value, 4, (width, height), RT.stream(RT.ffi.NULL), "cuMemsetD2D32")


@handles("cuMemsetD2D8Async@3020")
def memset_d2d8_async(dst: int, pitch: int, value: int, w: int, h: int, stream: Any) -> None:
    memset_2d(dst, pitch, value, 1, (w, h), RT.stream(stream), "cuMemsetD2D8Async")


@handles("cuMemsetD2D16Async@3020")
def memset_d2d16_async(dst: int, pitch: int, value: int, w: int, h: int, stream: Any) -> None:
    memset_2d(dst, pitch, value, 2, (w, h), RT.stream(stream), "cuMemsetD2D16Async")


@handles("cuMemsetD2D32Async@3020")
def memset_d2d32_async(dst: int, pitch: int, value: int, w: int, h: int, stream: Any) -> None:
    memset_2d(dst, pitch, value, 4, (w, h), RT.stream(stream), "cuMemsetD2D32Async")
