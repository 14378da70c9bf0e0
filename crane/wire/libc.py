"""The C library's memory-mapping calls Python's ``mmap`` module lacks, declared once.

Why: mapping at an exact address (``MAP_FIXED``) and punching holes in a file have no Python
API, and two parts need them: the guest's host mirrors of device memory
(:mod:`crane.guest.mirror`) and the simulated GPU, which maps another worker's memfd over its
window when a same-host migration hands the memory over (``crane.backends.sim.memory``).
"""

from __future__ import annotations

import ctypes

__all__ = [
    "FALLOC_PUNCH_HOLE",
    "MAP_ANONYMOUS",
    "MAP_FAILED",
    "MAP_FIXED",
    "MAP_FIXED_NOREPLACE",
    "MAP_NORESERVE",
    "MAP_PRIVATE",
    "MAP_SHARED",
    "PROT_NONE",
    "PROT_RW",
    "libc",
]

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
)
libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long)
PROT_NONE, PROT_RW = 0, 3
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x01, 0x02, 0x10, 0x20
MAP_NORESERVE, MAP_FIXED_NOREPLACE = 0x4000, 0x100000
MAP_FAILED = ctypes.c_void_p(-1).value
#: FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE: release a file's pages, keep its size.
FALLOC_PUNCH_HOLE = 0x02 | 0x01
