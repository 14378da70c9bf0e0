"""Texture and surface objects as the device sees them: a descriptor in device memory.

A ``CUtexObject``/``CUsurfObject`` handed out by Crane is the device address of a small
allocation holding one :class:`TexDesc` (the layout below), written by the guest when the
object is created. A kernel receives the handle as a 64-bit parameter and the simulated GPU's
``tex``/``tld4``/``suld``/``sust`` read the descriptor from device memory at that address, much
as a GPU reads a texture header from its descriptor pool. Why memory rather than a worker-side
table: the descriptor is then ordinary session memory, so the state record, checkpoints and live
migration carry it (and the array it points to) with no new object type, and the dirty tracker
follows the pointer it holds to the array (a surface store marks the array written).

CUDA arrays are laid out linearly in their allocation (x fastest, then rows, then slices or
layers, then mipmap levels), which is what the descriptor's pitches describe. This module is
the one definition of that format: the guest writes it (crane.interposer.h_texture), the
simulator reads it (crane.backends.sim.ptx.ops_tex).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "ARRAY3D_CUBEMAP",
    "ARRAY3D_LAYERED",
    "ARRAY3D_SURFACE_LDST",
    "ARRAY3D_TEXTURE_GATHER",
    "DESC_BYTES",
    "FORMATS",
    "MAGIC_SURF",
    "MAGIC_TEX",
    "MAX_LEVELS",
    "RES_ARRAY",
    "RES_LINEAR",
    "RES_MIPMAPPED",
    "RES_PITCH2D",
    "TRSF_NORMALIZED_COORDINATES",
    "TRSF_READ_AS_INTEGER",
    "TRSF_SRGB",
    "Level",
    "TexDesc",
]

# CUarray_format -> (numpy dtype string, element bytes, kind): "u"/"s" integers, "f" float.
FORMATS: dict[int, tuple[str, int, str]] = {
    0x01: ("<u1", 1, "u"),
    0x02: ("<u2", 2, "u"),
    0x03: ("<u4", 4, "u"),
    0x08: ("<i1", 1, "s"),
    0x09: ("<i2", 2, "s"),
    0x0A: ("<i4", 4, "s"),
    0x10: ("<f2", 2, "f"),
    0x20: ("<f4", 4, "f"),
}

# CUDA_ARRAY3D_* flags (cuda.h)
ARRAY3D_LAYERED = 0x01
ARRAY3D_SURFACE_LDST = 0x02
ARRAY3D_CUBEMAP = 0x04
ARRAY3D_TEXTURE_GATHER = 0x08

# CUresourcetype
RES_ARRAY, RES_MIPMAPPED, RES_LINEAR, RES_PITCH2D = 0, 1, 2, 3

# CU_TRSF_* (cuTexObjectCreate's CUDA_TEXTURE_DESC.flags)
TRSF_READ_AS_INTEGER = 0x01
TRSF_NORMALIZED_COORDINATES = 0x02
TRSF_SRGB = 0x10

MAGIC_TEX = 0x58545243  # "CRTX"
MAGIC_SURF = 0x46535243  # "CRSF"
MAX_LEVELS = 16

_HEAD = struct.Struct("<IIIIIIIIIIII4f3f")  # 12 u32 + border[4] + mip bias/min/max
_LEVEL = struct.Struct("<QQQIII4x")  # base, row pitch, slice pitch, width, height, depth
DESC_BYTES = _HEAD.size + 4 + MAX_LEVELS * _LEVEL.size


@dataclass(frozen=True)
class Level:
    """One mipmap level (or the only one): where it lies and its extent in texels.

    ``depth`` counts slices of a 3D array, or layers (6 per cubemap) of a layered one."""

    base: int
    pitch: int
    slice: int
    width: int
    height: int
    depth: int


@dataclass(frozen=True)
class TexDesc:
    """A texture or surface object. ``flags`` are the array's CUDA_ARRAY3D_* flags,
    ``tex_flags`` the texture's CU_TRSF_* flags; filtering and addressing only mean something
    for textures."""

    magic: int
    res_type: int
    format: int
    channels: int
    flags: int
    levels: tuple[Level, ...]
    address: tuple[int, int, int] = (0, 0, 0)
    filter: int = 0
    tex_flags: int = 0
    mip_filter: int = 0
    border: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    mip_bias: float = 0.0
    mip_min: float = 0.0
    mip_max: float = 0.0

    @property
    def elem_bytes(self) -> int:
        return FORMATS[self.format][1] * self.channels

    def pack(self) -> bytes:
        head = _HEAD.pack(
            self.magic,
            self.res_type,
            self.format,
            self.channels,
            self.flags,
            *self.address,
            self.filter,
            self.tex_flags,
            self.mip_filter,
            0,
            *self.border,
            self.mip_bias,
            self.mip_min,
            self.mip_max,
        )
        lv = b"".join(
            _LEVEL.pack(v.base, v.pitch, v.slice, v.width, v.height, v.depth) for v in self.levels
        )
        out = head + struct.pack("<I", len(self.levels)) + lv
        return out + bytes(DESC_BYTES - len(out))

    @classmethod
    def unpack(cls, raw: bytes) -> TexDesc:
        """Decode a descriptor; ValueError when the bytes are not one (a wrong handle)."""
        if len(raw) < DESC_BYTES:
            raise ValueError("short texture descriptor")
        h = _HEAD.unpack_from(raw, 0)
        if h[0] not in (MAGIC_TEX, MAGIC_SURF) or h[2] not in FORMATS:
            raise ValueError("not a texture or surface object")
        (n,) = struct.unpack_from("<I", raw, _HEAD.size)
        if not 1 <= n <= MAX_LEVELS or h[3] not in (1, 2, 4):
            raise ValueError("corrupt texture descriptor")
        levels = tuple(
            Level(*_LEVEL.unpack_from(raw, _HEAD.size + 4 + i * _LEVEL.size)) for i in range(n)
        )
        csize = FORMATS[h[2]][1]
        for v in levels:  # device memory is the application's to overwrite: trust nothing
            if (
                min(v.width, v.height, v.depth) < 1
                or v.pitch < v.width * csize * h[3]
                or v.slice < v.pitch * v.height
                or v.pitch % csize
                or v.slice % csize
                or v.base + v.slice * v.depth >= 1 << 64
                or (h[4] & ARRAY3D_CUBEMAP and v.depth % 6)
            ):
                raise ValueError("inconsistent texture descriptor")
        return cls(
            magic=h[0],
            res_type=h[1],
            format=h[2],
            channels=h[3],
            flags=h[4],
            address=(h[5], h[6], h[7]),
            filter=h[8],
            tex_flags=h[9],
            mip_filter=h[10],
            levels=levels,
            border=tuple(h[12:16]),  # type: ignore[arg-type]
            mip_bias=h[16],
            mip_min=h[17],
            mip_max=h[18],
        )
