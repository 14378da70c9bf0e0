"""CUDA arrays in the guest: a descriptor record over an ordinary device allocation.

An array's layout is opaque to applications (they reach it only through copies, textures and
surfaces), so Crane lays it out linearly inside one allocation of the session: x fastest, then
rows, then slices (3D) or layers (layered, cubemap faces), then mipmap levels, each level
aligned to 512 bytes. Its bytes are therefore session memory the worker already records, so
checkpoints, restores and live migration carry array contents with no new object type; the
record itself (format, extent, flags) lives here, in the guest process, which survives a park or
a move like a graph does. Handles are guest-chosen ids with their own kind byte, so an array
passed where a mipmapped array is expected is caught locally.
"""

from __future__ import annotations

import itertools
import struct
import threading
from dataclasses import dataclass

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.api.texdesc import (
    ARRAY3D_CUBEMAP,
    ARRAY3D_LAYERED,
    ARRAY3D_SURFACE_LDST,
    ARRAY3D_TEXTURE_GATHER,
    FORMATS,
    Level,
)

__all__ = [
    "ARRAY3D_DESC",
    "ARRAY_DESC",
    "TABLE",
    "ArrayTable",
    "CudaArray",
    "Extent",
    "MipmappedArray",
    "plan_levels",
]

ARRAY_DESC = struct.Struct("<QQII")  # CUDA_ARRAY_DESCRIPTOR: Width, Height, Format, NumChannels
ARRAY3D_DESC = struct.Struct("<QQQIII4x")  # CUDA_ARRAY3D_DESCRIPTOR (+ Depth, Flags)
_KIND_ARRAY, _KIND_MIPMAP = 0xA1, 0xA2
_LEVEL_ALIGN = 512
# flags cuArray3DCreate accepts; sparse, deferred mapping and the graphics ones are refused
_KNOWN_FLAGS = ARRAY3D_LAYERED | ARRAY3D_SURFACE_LDST | ARRAY3D_CUBEMAP | ARRAY3D_TEXTURE_GATHER
_MAX_DIM = 1 << 17  # above every CUDA 13 device's largest texture/surface extent


def _invalid(why: str) -> CudaError:
    return CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, why)


@dataclass(frozen=True)
class Extent:
    """What a CUDA_ARRAY3D_DESCRIPTOR says, checked: width/height/depth as given (0 = absent)."""

    width: int
    height: int
    depth: int
    format: int
    channels: int
    flags: int

    @classmethod
    def checked(
        cls, width: int, height: int, depth: int, fmt: int, channels: int, flags: int
    ) -> Extent:
        """Apply cuArray3DCreate's documented rules (dimensions per kind of array, cubemaps
        square with 6 faces per layer, 1, 2 or 4 channels of a known format)."""
        if fmt not in FORMATS:
            raise CudaError(
                CUresult.CUDA_ERROR_NOT_SUPPORTED
                if fmt >= 0x40
                else CUresult.CUDA_ERROR_INVALID_VALUE,
                f"array format {fmt:#x} is not a supported CUarray_format",
            )
        if channels not in (1, 2, 4):
            raise _invalid(f"NumChannels {channels} (must be 1, 2 or 4)")
        if flags & ~_KNOWN_FLAGS:
            raise CudaError(
                CUresult.CUDA_ERROR_NOT_SUPPORTED,
                f"array flags {flags & ~_KNOWN_FLAGS:#x} (sparse, deferred-mapping, depth or "
                "color-attachment arrays) are not supported",
            )
        if width == 0 or max(width, height, depth) > _MAX_DIM:
            raise _invalid(f"array extent {width}x{height}x{depth}")
        if height == 0 and depth and not flags & ARRAY3D_LAYERED:
            raise _invalid("a 1D array has Depth 0 (or is layered)")
        if flags & ARRAY3D_CUBEMAP:
            if width != height:
                raise _invalid("a cubemap array is square (Width == Height)")
            faces = depth if flags & ARRAY3D_LAYERED else 6
            if depth != faces or depth == 0 or depth % 6:
                raise _invalid("a cubemap has Depth 6 (a layered one a multiple of 6)")
        elif flags & ARRAY3D_LAYERED and depth == 0:
            raise _invalid("a layered array has Depth = its number of layers (> 0)")
        return cls(width, height, depth, fmt, channels, flags)

    @property
    def elem_bytes(self) -> int:
        return FORMATS[self.format][1] * self.channels

    @property
    def layered(self) -> bool:
        return bool(self.flags & (ARRAY3D_LAYERED | ARRAY3D_CUBEMAP))

    def level(self, i: int) -> tuple[int, int, int]:
        """Width, height, depth (0 kept 0) of mipmap level ``i``; layers never shrink."""
        w = max(1, self.width >> i)
        h = max(1, self.height >> i) if self.height else 0
        d = self.depth if self.layered else (max(1, self.depth >> i) if self.depth else 0)
        return w, h, d


def plan_levels(ext: Extent, count: int) -> tuple[list[tuple[int, int, int, int, int]], int]:
    """Offsets and layout of ``count`` levels in one allocation: ``[(offset, pitch, slice,
    rows, slices)]`` and the total size."""
    out, at = [], 0
    for i in range(count):
        w, h, d = ext.level(i)
        pitch = w * ext.elem_bytes
        rows, slices = max(h, 1), max(d, 1)
        out.append((at, pitch, pitch * rows, rows, slices))
        at += -(-pitch * rows * slices // _LEVEL_ALIGN) * _LEVEL_ALIGN
    return out, at


@dataclass(frozen=True)
class CudaArray:
    """One array (or one level of a mipmapped array, ``owner`` naming it)."""

    handle: int
    base: int
    pitch: int
    slice: int
    rows: int
    slices: int
    extent: Extent
    level_extent: tuple[int, int, int]
    owner: int = 0

    @property
    def size(self) -> int:
        return self.slice * self.slices

    def level(self) -> Level:
        w, h, d = self.level_extent
        return Level(self.base, self.pitch, self.slice, w, max(h, 1), max(d, 1))

    def descriptor3d(self) -> bytes:
        w, h, d = self.level_extent
        e = self.extent
        return ARRAY3D_DESC.pack(w, h, d, e.format, e.channels, e.flags)


@dataclass(frozen=True)
class MipmappedArray:
    handle: int
    base: int
    extent: Extent
    levels: tuple[CudaArray, ...]


class ArrayTable:
    """The guest's arrays and mipmapped arrays by handle (thread-safe)."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.arrays: dict[int, CudaArray] = {}
        self.mipmaps: dict[int, MipmappedArray] = {}

    def _new(self, kind: int) -> int:
        return (kind << 56) | next(self._ids)

    def add_array(self, ext: Extent, base: int) -> CudaArray:
        plan, _ = plan_levels(ext, 1)
        off, pitch, sl, rows, slices = plan[0]
        with self._lock:
            h = self._new(_KIND_ARRAY)
            a = CudaArray(h, base + off, pitch, sl, rows, slices, ext, ext.level(0))
            self.arrays[h] = a
        return a

    def add_mipmap(self, ext: Extent, base: int, count: int) -> MipmappedArray:
        plan, _ = plan_levels(ext, count)
        with self._lock:
            mh = self._new(_KIND_MIPMAP)
            levels = []
            for i, (off, pitch, sl, rows, slices) in enumerate(plan):
                h = self._new(_KIND_ARRAY)
                a = CudaArray(h, base + off, pitch, sl, rows, slices, ext, ext.level(i), mh)
                self.arrays[h] = a
                levels.append(a)
            m = MipmappedArray(mh, base, ext, tuple(levels))
            self.mipmaps[mh] = m
        return m

    def array(self, handle: int) -> CudaArray:
        a = self.arrays.get(handle)
        if a is None:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, f"{handle:#x} is not a CUDA array")
        return a

    def mipmap(self, handle: int) -> MipmappedArray:
        m = self.mipmaps.get(handle)
        if m is None:
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_HANDLE, f"{handle:#x} is not a mipmapped array"
            )
        return m

    def drop_array(self, handle: int) -> CudaArray:
        with self._lock:
            a = self.array(handle)
            if a.owner:
                raise CudaError(
                    CUresult.CUDA_ERROR_INVALID_HANDLE,
                    "a mipmapped array's level is destroyed with its mipmapped array",
                )
            del self.arrays[handle]
        return a

    def drop_mipmap(self, handle: int) -> MipmappedArray:
        with self._lock:
            m = self.mipmap(handle)
            del self.mipmaps[handle]
            for lv in m.levels:
                self.arrays.pop(lv.handle, None)
        return m


#: The process's arrays (one session per process, like the interposer's other tables).
TABLE = ArrayTable()
