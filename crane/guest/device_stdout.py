"""Where a kernel's printf output goes: the process's C ``stdout`` stream.

Why: the driver prints a kernel's output through the C library's ``stdout``, so it comes out
in order with what the program printed before the launch. Written straight to file
descriptor 1 (as it once was), the device's lines overtook the host's whenever stdout was a
file or a pipe (block-buffered: the host's lines still sat in the C library's buffer), as in
cuda-samples' simplePrintf run with its output captured. The stream is flushed after each
write, so the output is no later than before. A process without a C ``stdout`` (none such is
known) gets the old write to descriptor 1.
"""

from __future__ import annotations

import ctypes
import os
import threading

__all__ = ["write_device_output"]

_lock = threading.Lock()
_libc: tuple[ctypes.CDLL, ctypes.c_void_p] | bool | None = False  # False: not looked up yet


def _c_stdout() -> tuple[ctypes.CDLL, ctypes.c_void_p] | None:
    global _libc
    with _lock:
        if _libc is False:
            try:
                libc = ctypes.CDLL(None)
                libc.fwrite.argtypes = (ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                        ctypes.c_void_p)  # fmt: skip
                libc.fwrite.restype = ctypes.c_size_t
                libc.fflush.argtypes = (ctypes.c_void_p,)
                _libc = (libc, ctypes.c_void_p.in_dll(libc, "stdout"))
            except (OSError, ValueError, AttributeError):
                _libc = None
        return _libc


def write_device_output(data: bytes) -> None:
    """Write a kernel's printf output as the driver does (see the module)."""
    found = _c_stdout()
    stream = found[1].value if found else None
    if not stream:
        os.write(1, data)
        return
    libc = found[0]
    libc.fwrite(data, 1, len(data), stream)
    libc.fflush(stream)
