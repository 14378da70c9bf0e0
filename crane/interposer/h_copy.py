"""2D and 3D copies (cuMemcpy2D*, cuMemcpy3D*) between host memory, device memory and arrays.

Each side of a copy descriptor resolves to an origin address, a row pitch and a slice pitch: for
host and device memory from the descriptor's pitch and height, for an array from its own layout
(:mod:`crane.interposer.arrays`: arrays are linear in their allocation), with the region checked
against the array's extent. Then the copy is rows of ``WidthInBytes``, merged where both sides
are contiguous; a device-to-host copy reads the whole source span once and scatters locally."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.interposer import graphs
from crane.interposer.arrays import TABLE
from crane.interposer.h_memory import copy, is_device, sync_call
from crane.interposer.registry import handles
from crane.interposer.runtime import RT

_MT_HOST, _MT_DEVICE, _MT_ARRAY, _MT_UNIFIED = 1, 2, 3, 4
_MEMCPY2D = struct.Struct("<QQI4xQQQQQQI4xQQQQQQ")  # CUDA_MEMCPY2D, 128 bytes
_SIDE3D = "QQQQI4xQQQQQQ"  # x, y, z, lod, memory type, host, device, array, reserved, pitch, h
_MEMCPY3D = struct.Struct("<" + _SIDE3D * 2 + "QQQ")  # CUDA_MEMCPY3D, 200 bytes


def _invalid(why: str) -> CudaError:
    return CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, why)


@dataclass(frozen=True)
class Side:
    """One side of a copy: where its region starts and how its rows and slices are spaced."""

    origin: int
    pitch: int
    slice: int
    rows: int  # rows per slice (the slice pitch in rows), for graph capture


def side(
    mtype: int, x: int, y: int, z: int, host: int, dev: int, arr: int, pitch: int, height: int,
    extent: tuple[int, int, int],
) -> Side:  # fmt: skip
    """Resolve a descriptor's side for a ``extent`` = (bytes, rows, slices) region."""
    w, h, d = extent
    if mtype == _MT_ARRAY:
        a = TABLE.array(arr)
        if x + w > a.pitch or y + h > a.rows or z + d > a.slices:
            raise _invalid(
                f"copy region ({x}+{w} bytes, {y}+{h} rows, {z}+{d} slices) is outside the "
                f"array ({a.pitch} bytes, {a.rows} rows, {a.slices} slices)"
            )
        return Side(a.base + z * a.slice + y * a.pitch + x, a.pitch, a.slice, a.rows)
    if mtype in (_MT_HOST, _MT_DEVICE, _MT_UNIFIED):
        base = host if mtype == _MT_HOST else dev
        if base == 0:
            raise _invalid("NULL pointer in a copy descriptor")
        if h > 1 and pitch < w:
            raise _invalid(f"pitch {pitch} smaller than the row width {w}")
        if d > 1 and height < h:
            raise _invalid(f"height {height} smaller than the copied rows {h}")
        return Side(base + (z * height + y) * pitch + x, pitch, pitch * height, height)
    raise _invalid(f"bad memory type {mtype}")


def _rows(dst: int, src: int, w: int, h: int, dpitch: int, spitch: int, stream: int) -> None:
    s = RT.session()
    if h == 1 or spitch == dpitch == w:
        copy(dst, src, w * h, stream)
        return
    if is_device(s, src) and not is_device(s, dst):
        span = (h - 1) * spitch + w
        buf = bytearray(span)
        s.memcpy_dtoh(src, span, stream, out=buf)
        view = memoryview(buf)
        for r in range(h):
            RT.ffi.memmove(
                RT.ffi.cast("char *", dst + r * dpitch), view[r * spitch : r * spitch + w], w
            )
        return
    for r in range(h):
        copy(dst + r * dpitch, src + r * spitch, w, stream)


def run(dst: Side, src: Side, w: int, h: int, d: int, stream: int) -> None:
    """Copy ``d`` slices of ``h`` rows of ``w`` bytes, in stream order (or record it)."""
    if w == 0 or h == 0 or d == 0:
        return
    if graphs.STREAMS:  # (the node is made only while some stream captures)
        cp = graphs.CopyParams(
            dst.origin, src.origin, w, h, d, dst.pitch, src.pitch, dst.rows, src.rows
        )
        if graphs.record(stream, graphs.MEMCPY, cp):
            return
    if d > 1 and dst.slice == src.slice == w * h and dst.pitch == src.pitch == w:
        copy(dst.origin, src.origin, w * h * d, stream)
        return
    for k in range(d):
        _rows(dst.origin + k * dst.slice, src.origin + k * src.slice, w, h, dst.pitch,
              src.pitch, stream)  # fmt: skip


def _read(p: Any, st: struct.Struct) -> tuple:
    if p == RT.ffi.NULL:
        raise _invalid("NULL copy descriptor")
    return st.unpack(bytes(RT.ffi.buffer(p, st.size)))


def copy_2d(p_copy: Any, stream: int) -> None:
    (sx, sy, smt, shost, sdev, sarr, spitch, dx, dy, dmt, dhost, ddev, darr, dpitch, w, h) = _read(
        p_copy, _MEMCPY2D
    )
    ext = (w, h, 1)
    src = side(smt, sx, sy, 0, shost, sdev, sarr, spitch, h, ext)
    dst = side(dmt, dx, dy, 0, dhost, ddev, darr, dpitch, h, ext)
    run(dst, src, w, h, 1, stream)


def copy_3d(p_copy: Any, stream: int) -> None:
    v = _read(p_copy, _MEMCPY3D)
    s, t, (w, h, d) = v[:11], v[11:22], v[22:]
    if s[3] or t[3]:
        raise _invalid("srcLOD and dstLOD must be 0 (copy a mipmap level through its array)")
    ext = (w, max(h, 1), max(d, 1))
    src = side(s[4], s[0], s[1], s[2], s[5], s[6], s[7], s[9], s[10], ext)
    dst = side(t[4], t[0], t[1], t[2], t[5], t[6], t[7], t[9], t[10], ext)
    run(dst, src, w, ext[1], ext[2], stream)


@handles("cuMemcpy2D@3020", "cuMemcpy2DUnaligned@3020")
def memcpy_2d(p_copy: Any) -> None:
    copy_2d(p_copy, sync_call("cuMemcpy2D"))


@handles("cuMemcpy2DAsync@3020")
def memcpy_2d_async(p_copy: Any, stream: Any) -> None:
    copy_2d(p_copy, RT.stream(stream))


@handles("cuMemcpy3D@3020")
def memcpy_3d(p_copy: Any) -> None:
    copy_3d(p_copy, sync_call("cuMemcpy3D"))


@handles("cuMemcpy3DAsync@3020")
def memcpy_3d_async(p_copy: Any, stream: Any) -> None:
    copy_3d(p_copy, RT.stream(stream))
