"""CUDA arrays and mipmapped arrays: creation, descriptors, destruction, 1D array copies.

Each array is one allocation of the session (:mod:`crane.interposer.arrays` says why and how it
is laid out); creating one is an asynchronous allocation, like cuMemAlloc."""

from __future__ import annotations

import struct
from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.interposer import graphs
from crane.interposer.arrays import ARRAY3D_DESC, ARRAY_DESC, TABLE, CudaArray, Extent, plan_levels
from crane.interposer.h_memory import copy, sync_call
from crane.interposer.registry import handles
from crane.interposer.runtime import RT

_MEM_REQ = struct.Struct("<QQ16x")  # CUDA_ARRAY_MEMORY_REQUIREMENTS: size, alignment, reserved
_ALIGN = 512


def _read(p: Any, st: struct.Struct, what: str) -> tuple:
    if p == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"NULL {what}")
    return st.unpack(bytes(RT.ffi.buffer(p, st.size)))


def _write(p: Any, raw: bytes) -> None:
    if p == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL descriptor")
    RT.ffi.memmove(p, raw, len(raw))


def _create(out: Any, ext: Extent) -> None:
    graphs.check_unsafe("cuArrayCreate")
    if out == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL pHandle")
    _, size = plan_levels(ext, 1)
    base = RT.session().mem_alloc(size, RT.ctx())
    out[0] = RT.ffi.cast("void *", TABLE.add_array(ext, base).handle)


def array_of(handle: Any) -> CudaArray:
    """The array a CUarray argument names."""
    return TABLE.array(RT.ptr(handle))


@handles("cuArrayCreate@3020")
def array_create(out: Any, desc: Any) -> None:
    w, h, fmt, ch = _read(desc, ARRAY_DESC, "pAllocateArray")
    _create(out, Extent.checked(w, h, 0, fmt, ch, 0))


@handles("cuArray3DCreate@3020")
def array3d_create(out: Any, desc: Any) -> None:
    _create(out, Extent.checked(*_read(desc, ARRAY3D_DESC, "pAllocateArray")))


@handles("cuArrayGetDescriptor@3020")
def array_get_descriptor(desc: Any, handle: Any) -> None:
    a = array_of(handle)
    w, h, _ = a.level_extent
    _write(desc, ARRAY_DESC.pack(w, h, a.extent.format, a.extent.channels))


@handles("cuArray3DGetDescriptor@3020")
def array3d_get_descriptor(desc: Any, handle: Any) -> None:
    _write(desc, array_of(handle).descriptor3d())


@handles("cuArrayDestroy@2000")
def array_destroy(handle: Any) -> None:
    graphs.check_unsafe("cuArrayDestroy")
    a = TABLE.drop_array(RT.ptr(handle))
    RT.session().mem_free(a.base)


@handles("cuArrayGetMemoryRequirements@11060")
def array_get_memory_requirements(out: Any, handle: Any, device: int) -> None:
    a = array_of(handle)
    _write(out, _MEM_REQ.pack(-(-a.size // _ALIGN) * _ALIGN, _ALIGN))


@handles("cuMipmappedArrayCreate@5000")
def mipmapped_array_create(out: Any, desc: Any, levels: int) -> None:
    graphs.check_unsafe("cuMipmappedArrayCreate")
    ext = Extent.checked(*_read(desc, ARRAY3D_DESC, "pMipmappedArrayDesc"))
    most = max(ext.width, ext.height, 0 if ext.layered else ext.depth).bit_length()
    if out == RT.ffi.NULL or not 1 <= levels <= most:
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_VALUE,
            f"numMipmapLevels {levels} (this extent has 1 to {most})",
        )
    _, size = plan_levels(ext, levels)
    base = RT.session().mem_alloc(size, RT.ctx())
    out[0] = RT.ffi.cast("void *", TABLE.add_mipmap(ext, base, levels).handle)


@handles("cuMipmappedArrayGetMemoryRequirements@11060")
def mipmapped_array_get_memory_requirements(out: Any, handle: Any, device: int) -> None:
    m = TABLE.mipmap(RT.ptr(handle))
    _, size = plan_levels(m.extent, len(m.levels))
    _write(out, _MEM_REQ.pack(size, _ALIGN))


@handles("cuMipmappedArrayGetLevel@5000")
def mipmapped_array_get_level(out: Any, handle: Any, level: int) -> None:
    m = TABLE.mipmap(RT.ptr(handle))
    if out == RT.ffi.NULL or level >= len(m.levels):
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"level {level} of {len(m.levels)}")
    out[0] = RT.ffi.cast("void *", m.levels[level].handle)


@handles("cuMipmappedArrayDestroy@5000")
def mipmapped_array_destroy(handle: Any) -> None:
    graphs.check_unsafe("cuMipmappedArrayDestroy")
    RT.session().mem_free(TABLE.drop_mipmap(RT.ptr(handle)).base)


# ---- copies naming an array by byte offset (the array seen as its bytes) ---------------------
def _span(a: CudaArray, offset: int, n: int) -> int:
    if offset + n > a.size:
        raise CudaError(
            CUresult.CUDA_ERROR_INVALID_VALUE,
            f"{n} bytes at offset {offset} run past the array's {a.size} bytes",
        )
    return a.base + offset


@handles("cuMemcpyAtoH@3020")
def memcpy_atoh(dst: Any, src: Any, offset: int, n: int) -> None:
    copy(RT.ptr(dst), _span(array_of(src), offset, n), n, sync_call("cuMemcpyAtoH"))


@handles("cuMemcpyAtoHAsync@3020")
def memcpy_atoh_async(dst: Any, src: Any, offset: int, n: int, stream: Any) -> None:
    copy(RT.ptr(dst), _span(array_of(src), offset, n), n, RT.stream(stream))


@handles("cuMemcpyHtoA@3020")
def memcpy_htoa(dst: Any, offset: int, src: Any, n: int) -> None:
    copy(_span(array_of(dst), offset, n), RT.ptr(src), n, sync_call("cuMemcpyHtoA"))


@handles("cuMemcpyHtoAAsync@3020")
def memcpy_htoa_async(dst: Any, offset: int, src: Any, n: int, stream: Any) -> None:
    copy(_span(array_of(dst), offset, n), RT.ptr(src), n, RT.stream(stream))


@handles("cuMemcpyAtoD@3020")
def memcpy_atod(dst: int, src: Any, offset: int, n: int) -> None:
    copy(dst, _span(array_of(src), offset, n), n, sync_call("cuMemcpyAtoD"))


@handles("cuMemcpyDtoA@3020")
def memcpy_dtoa(dst: Any, offset: int, src: int, n: int) -> None:
    copy(_span(array_of(dst), offset, n), src, n, sync_call("cuMemcpyDtoA"))


@handles("cuMemcpyAtoA@3020")
def memcpy_atoa(dst: Any, doff: int, src: Any, soff: int, n: int) -> None:
    d, s = _span(array_of(dst), doff, n), _span(array_of(src), soff, n)
    copy(d, s, n, sync_call("cuMemcpyAtoA"))
