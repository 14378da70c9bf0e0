"""Build fatbins byte by byte, for tests that need images nvcc will not produce.

Why: malformed-input tests and the layout-disagreement test need fatbins with chosen
fields (a bad header size, an unknown flag, a PTX edited to disagree with its cubin); this
writes the observed layout (facts file section 3) from explicit values.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import lz4.block
import zstandard

from crane.modules.fatbin import FATBIN_MAGIC, FLAG_LZ4, FLAG_ZSTD

__all__ = ["RawEntry", "build_fatbin", "entry_bytes"]


@dataclass
class RawEntry:
    kind: int
    sm: int
    payload: bytes
    flags: int = 0x11
    compress: str | None = None  # "zstd" or "lz4"
    header_size: int = 64
    version: tuple[int, int] = (1, 8)


def entry_bytes(e: RawEntry) -> bytes:
    stored = e.payload
    csize = usize = 0
    flags = e.flags
    if e.compress == "zstd":
        stored = zstandard.ZstdCompressor().compress(e.payload)
        flags |= FLAG_ZSTD
    elif e.compress == "lz4":
        stored = lz4.block.compress(e.payload, store_size=False)
        flags |= FLAG_LZ4
    if e.compress:
        csize, usize = len(stored), len(e.payload)
        stored += b"\0" * (-len(stored) % 8)
    header = bytearray(e.header_size)
    struct.pack_into("<HHIQ", header, 0, e.kind, 0x0101, e.header_size, len(stored))
    struct.pack_into("<IIHHI", header, 16, csize, 0, e.version[1], e.version[0], e.sm)
    struct.pack_into("<Q", header, 40, flags)
    struct.pack_into("<Q", header, 56, usize)
    return bytes(header) + stored


def build_fatbin(*entries: RawEntry) -> bytes:
    body = b"".join(entry_bytes(e) for e in entries)
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body
