"""The JIT options an application passes to cuModuleLoadDataEx, cuLibraryLoadData and cuLink*.

Why: applications read the JIT's logs and timings back through the same option arrays they
passed in (``CUjit_option`` / ``void *`` pairs). The driver writes the info and error logs into
the caller's buffers, NUL-terminated and capped at the ``_SIZE_BYTES`` value, and overwrites
that size slot with the bytes it used, and it overwrites ``CU_JIT_WALL_TIME``'s slot with the
milliseconds spent as a ``float``. Every other option is a hint to a compiler (optimization
level, register limits, target) that the JIT here has no use for; they are accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from crane.api.generated.cuda_enums import CUjit_option as J
from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError

__all__ = ["JitOptions"]


@dataclass
class JitOptions:
    """The options of one call, with the slots the driver writes back."""

    ffi: Any
    vals: Any
    slots: dict[int, int]

    @classmethod
    def read(cls, ffi: Any, n: int, opts: Any, vals: Any) -> JitOptions:
        n = int(n)
        if n <= 0:
            return cls(ffi, ffi.NULL, {})
        if opts == ffi.NULL or vals == ffi.NULL:
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"{n} JIT options but NULL arrays")
        slots = {}
        for i in range(n):
            opt = int(opts[i])
            if opt < 0 or opt >= 64:
                raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"unknown JIT option {opt}")
            slots[opt] = i
        return cls(ffi, vals, slots)

    def _log(self, buf_opt: int, size_opt: int, text: str) -> None:
        if buf_opt not in self.slots or size_opt not in self.slots:
            return
        buf = self.vals[self.slots[buf_opt]]
        size_slot = self.slots[size_opt]
        size = int(self.ffi.cast("uintptr_t", self.vals[size_slot])) & 0xFFFFFFFF
        if buf == self.ffi.NULL or size <= 0:
            return
        data = text.encode("utf-8", "replace")[: size - 1] + b"\0"
        self.ffi.memmove(self.ffi.cast("char *", buf), data, len(data))
        # OUT: the bytes of the buffer filled, as the driver reports them
        self.vals[size_slot] = self.ffi.cast("void *", len(data) - 1)

    def write_info(self, text: str) -> None:
        self._log(J.CU_JIT_INFO_LOG_BUFFER, J.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, text)

    def write_error(self, text: str) -> None:
        self._log(J.CU_JIT_ERROR_LOG_BUFFER, J.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, text)

    def write_wall_time(self, ms: float) -> None:
        if J.CU_JIT_WALL_TIME in self.slots:
            slot = self.vals + self.slots[J.CU_JIT_WALL_TIME]
            self.ffi.cast("float *", slot)[0] = float(ms)
