"""Read a module image out of guest memory when all the driver API gives is a pointer.

cudart passes the ``__fatBinC_Wrapper_t`` (no size); programs pass a fatbin, a cubin or PTX
text. The size comes from the image's own headers: fatbin header + ``filesSize``; the furthest
ELF section or header table; PTX up to its terminating NUL."""

from __future__ import annotations

import struct
from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.modules.errors import ImageError
from crane.modules.fatbin import (
    FATBIN_MAGIC,
    WRAPPER_MAGIC,
    WRAPPER_SIZE,
    fatbin_total_size,
    parse_wrapper,
)

__all__ = ["image_from_pointer"]

_ELF_MAGIC = 0x464C457F


def image_from_pointer(ffi: Any, ptr: int) -> bytes:
    if ptr == 0:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL image")

    def read(addr: int, n: int) -> bytes:
        return bytes(ffi.buffer(ffi.cast("char *", addr), n))

    try:
        magic = struct.unpack("<I", read(ptr, 4))[0]
        if magic == WRAPPER_MAGIC:
            return image_from_pointer(ffi, parse_wrapper(read(ptr, WRAPPER_SIZE)).data_ptr)
        if magic == FATBIN_MAGIC:
            return read(ptr, fatbin_total_size(read(ptr, 16)))
        if magic == _ELF_MAGIC:
            return read(ptr, _elf_size(read, ptr))
    except ImageError as e:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_IMAGE, str(e)) from None
    return ffi.string(ffi.cast("char *", ptr))  # PTX text


def _elf_size(read: Any, ptr: int) -> int:
    """Full ELF size: the header tables and the furthest section's data."""
    hdr = read(ptr, 64)
    if hdr[4] != 2:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_IMAGE, "only 64-bit ELF images are supported")
    phoff, shoff = struct.unpack_from("<QQ", hdr, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", hdr, 0x36)
    end = max(64, phoff + phentsize * phnum, shoff + shentsize * shnum)
    table = read(ptr + shoff, shentsize * shnum) if shoff and shnum else b""
    for i in range(shnum if table else 0):
        sh_type = struct.unpack_from("<I", table, i * shentsize + 4)[0]
        off, size = struct.unpack_from("<QQ", table, i * shentsize + 0x18)
        if sh_type != 8:  # SHT_NOBITS occupies no file space
            end = max(end, off + size)
    return end
