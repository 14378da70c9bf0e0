"""Texture and surface objects: each one a descriptor in device memory, its address the handle.

Why device memory (see :mod:`crane.api.texdesc`): the simulated GPU's texture instructions read
the descriptor the kernel's 64-bit handle points to, and the state record, checkpoints and
migration carry it as ordinary session memory. The guest keeps the application's own resource
and texture descriptors to answer the Get*Desc queries. A real GPU (the cuda backend) needs the
driver's own objects, which the guest cannot create; there, creating one is NOT_SUPPORTED."""

from __future__ import annotations

import struct
import threading
from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.api.texdesc import (
    ARRAY3D_SURFACE_LDST,
    ARRAY3D_TEXTURE_GATHER,
    DESC_BYTES,
    FORMATS,
    MAGIC_SURF,
    MAGIC_TEX,
    RES_ARRAY,
    RES_LINEAR,
    RES_MIPMAPPED,
    RES_PITCH2D,
    TRSF_NORMALIZED_COORDINATES,
    TRSF_READ_AS_INTEGER,
    Level,
    TexDesc,
)
from crane.interposer import graphs
from crane.interposer.arrays import TABLE
from crane.interposer.registry import handles
from crane.interposer.runtime import RT

_RES = struct.Struct("<I4x128sI4x")  # CUDA_RESOURCE_DESC, 144 bytes
_TEX = struct.Struct("<3IIIIIfff4f48x")  # CUDA_TEXTURE_DESC, 104 bytes
_LINEAR = struct.Struct("<QIIQ")  # devPtr, format, numChannels, sizeInBytes
_PITCH2D = struct.Struct("<QIIQQQ")  # devPtr, format, numChannels, width, height, pitchInBytes
_TEXTURE_ALIGN, _PITCH_ALIGN = 256, 32  # cudaMalloc's alignment; texture pitch alignment
_MAX_LINEAR = 1 << 28  # cudaDevAttrMaxTexture1DLinearWidth on every CUDA 13 device


def _invalid(why: str) -> CudaError:
    return CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, why)


class _Objects:
    """Handle -> the application's (resource, texture) descriptor bytes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tex: dict[int, tuple[bytes, bytes]] = {}
        self.surf: dict[int, bytes] = {}


_OBJ = _Objects()


def _buf(p: Any, n: int, what: str) -> bytes:
    if p == RT.ffi.NULL:
        raise _invalid(f"NULL {what}")
    return bytes(RT.ffi.buffer(p, n))


def _need_simulator() -> None:
    if RT.session().device.profile.startswith("cuda:"):
        raise CudaError(
            CUresult.CUDA_ERROR_NOT_SUPPORTED,
            "texture and surface objects are served on the simulated GPU only (a real GPU "
            "needs the driver's own objects)",
        )


def _format(fmt: int, channels: int) -> None:
    if fmt not in FORMATS or channels not in (1, 2, 4):
        raise _invalid(f"format {fmt:#x} with {channels} channels")


def resource(raw: bytes) -> tuple[int, int, int, int, tuple[Level, ...]]:
    """(resource type, format, channels, array flags, levels) of a CUDA_RESOURCE_DESC."""
    rtype, union, flags = _RES.unpack(raw)
    if flags:
        raise _invalid("CUDA_RESOURCE_DESC.flags must be 0")
    if rtype == RES_ARRAY:
        a = TABLE.array(struct.unpack_from("<Q", union)[0])
        e = a.extent
        return rtype, e.format, e.channels, e.flags, (a.level(),)
    if rtype == RES_MIPMAPPED:
        m = TABLE.mipmap(struct.unpack_from("<Q", union)[0])
        e = m.extent
        return rtype, e.format, e.channels, e.flags, tuple(lv.level() for lv in m.levels)
    if rtype == RES_LINEAR:
        ptr, fmt, ch, size = _LINEAR.unpack_from(union)
        _format(fmt, ch)
        elem = FORMATS[fmt][1] * ch
        if ptr % _TEXTURE_ALIGN or size < elem or size // elem > _MAX_LINEAR:
            raise _invalid(f"linear texture at {ptr:#x} of {size} bytes")
        _inside(ptr, size)
        return rtype, fmt, ch, 0, (Level(ptr, size, size, size // elem, 1, 1),)
    if rtype == RES_PITCH2D:
        ptr, fmt, ch, w, h, pitch = _PITCH2D.unpack_from(union)
        _format(fmt, ch)
        elem = FORMATS[fmt][1] * ch
        if ptr % _PITCH_ALIGN or pitch % _PITCH_ALIGN or w * elem > pitch or not w or not h:
            raise _invalid(f"pitch2D texture at {ptr:#x}: {w}x{h}, pitch {pitch}")
        _inside(ptr, pitch * h)
        return rtype, fmt, ch, 0, (Level(ptr, pitch, pitch * h, w, h, 1),)
    raise _invalid(f"resource type {rtype}")


def _inside(ptr: int, size: int) -> None:
    if not RT.session().va.check(ptr, size):
        raise _invalid(f"{size} bytes at {ptr:#x} are not inside one allocation")


def _store(desc: TexDesc) -> int:
    s = RT.session()
    addr = s.mem_alloc(DESC_BYTES, RT.ctx())
    s.memcpy_htod(addr, desc.pack(), RT.stream(RT.ffi.NULL))
    return addr


@handles("cuTexObjectCreate@5000")
def tex_object_create(out: Any, p_res: Any, p_tex: Any, p_view: Any) -> None:
    graphs.check_unsafe("cuTexObjectCreate")
    if out == RT.ffi.NULL:
        raise _invalid("NULL pTexObject")
    if p_view != RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_NOT_SUPPORTED, "texture resource views")
    _need_simulator()
    res_raw, tex_raw = _buf(p_res, _RES.size, "pResDesc"), _buf(p_tex, _TEX.size, "pTexDesc")
    rtype, fmt, ch, aflags, levels = resource(res_raw)
    t = _TEX.unpack(tex_raw)
    modes, filt, flags, _aniso, mip_filter = t[0:3], t[3], t[4], t[5], t[6]
    if any(m > 3 for m in modes) or filt > 1 or mip_filter > 1:
        raise _invalid("address or filter mode out of range")
    kind = FORMATS[fmt][2]
    as_int = kind != "f" and (flags & TRSF_READ_AS_INTEGER or FORMATS[fmt][1] == 4)
    if filt == 1 and as_int:
        raise _invalid("linear filtering needs a texture that returns floats")
    if rtype in (RES_LINEAR,) and (filt or flags & TRSF_NORMALIZED_COORDINATES):
        raise _invalid("a linear-memory texture has point filtering and integer coordinates")
    desc = TexDesc(
        magic=MAGIC_TEX,
        res_type=rtype,
        format=fmt,
        channels=ch,
        flags=aflags,
        levels=levels,
        address=modes,  # type: ignore[arg-type]
        filter=filt,
        tex_flags=flags | (TRSF_READ_AS_INTEGER if as_int else 0),
        mip_filter=mip_filter,
        mip_bias=t[7],
        mip_min=t[8],
        mip_max=t[9],
        border=tuple(t[10:14]),  # type: ignore[arg-type]
    )
    h = _store(desc)
    with _OBJ.lock:
        _OBJ.tex[h] = (res_raw, tex_raw)
    out[0] = h


@handles("cuTexObjectDestroy@5000")
def tex_object_destroy(obj: int) -> None:
    with _OBJ.lock:
        if _OBJ.tex.pop(obj, None) is None:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, f"{obj:#x} is no texture object")
    RT.session().mem_free(obj)


def _lookup(table: dict, obj: int, what: str):
    with _OBJ.lock:
        got = table.get(obj)
    if got is None:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, f"{obj:#x} is no {what} object")
    return got


def _answer(p: Any, raw: bytes, what: str) -> None:
    if p == RT.ffi.NULL:
        raise _invalid(f"NULL {what}")
    RT.ffi.memmove(p, raw, len(raw))


@handles("cuTexObjectGetResourceDesc@5000")
def tex_object_get_resource_desc(p_res: Any, obj: int) -> None:
    _answer(p_res, _lookup(_OBJ.tex, obj, "texture")[0], "pResDesc")


@handles("cuTexObjectGetTextureDesc@5000")
def tex_object_get_texture_desc(p_tex: Any, obj: int) -> None:
    _answer(p_tex, _lookup(_OBJ.tex, obj, "texture")[1], "pTexDesc")


@handles("cuSurfObjectCreate@5000")
def surf_object_create(out: Any, p_res: Any) -> None:
    graphs.check_unsafe("cuSurfObjectCreate")
    if out == RT.ffi.NULL:
        raise _invalid("NULL pSurfObject")
    _need_simulator()
    res_raw = _buf(p_res, _RES.size, "pResDesc")
    rtype, fmt, ch, aflags, levels = resource(res_raw)
    if rtype != RES_ARRAY or not aflags & ARRAY3D_SURFACE_LDST:
        raise _invalid("a surface is a CUDA array created with CUDA_ARRAY3D_SURFACE_LDST")
    desc = TexDesc(MAGIC_SURF, rtype, fmt, ch, aflags & ~ARRAY3D_TEXTURE_GATHER, levels)
    h = _store(desc)
    with _OBJ.lock:
        _OBJ.surf[h] = res_raw
    out[0] = h


@handles("cuSurfObjectDestroy@5000")
def surf_object_destroy(obj: int) -> None:
    with _OBJ.lock:
        if _OBJ.surf.pop(obj, None) is None:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, f"{obj:#x} is no surface object")
    RT.session().mem_free(obj)


@handles("cuSurfObjectGetResourceDesc@5000")
def surf_object_get_resource_desc(p_res: Any, obj: int) -> None:
    _answer(p_res, _lookup(_OBJ.surf, obj, "surface"), "pResDesc")
