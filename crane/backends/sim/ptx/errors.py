"""Errors of the PTX interpreter.

Three kinds, kept apart because they surface at different times:

* :class:`PtxError` — the module text is not PTX we can read (a syntax error, an undeclared
  register). Raised by :func:`~crane.backends.sim.ptx.load_ptx`; the backend answers
  CUDA_ERROR_INVALID_PTX.
* :class:`PtxUnsupported` (a :class:`PtxError`) — valid PTX that uses an instruction, modifier or
  feature the interpreter does not implement. Also raised at load, never at run time, so an
  unsupported kernel can never produce a wrong answer. The message names the instruction and
  its PTX line.
* :class:`KernelFault` — a launch failed: a fault while running (illegal or misaligned address,
  ``trap``, a failed device ``assert``) or a launch configuration the device refuses. ``code``
  is the CUresult the launch reports.
"""

from __future__ import annotations

from crane.api.generated.cuda_enums import CUresult

__all__ = ["KernelFault", "PtxError", "PtxUnsupported", "fault_code"]


class PtxError(Exception):
    """The PTX text cannot be parsed or decoded (CUDA_ERROR_INVALID_PTX)."""

    code = int(CUresult.CUDA_ERROR_INVALID_PTX)

    def __init__(self, message: str, line: int | None = None) -> None:
        self.line = line
        self.message = message
        super().__init__(f"PTX line {line}: {message}" if line is not None else message)


class PtxUnsupported(PtxError):
    """Valid PTX the interpreter does not implement; refused when the module is loaded."""


class KernelFault(Exception):
    """A launch failed with CUresult ``code`` (700, 710, 715, 716, 719, 1, 701 ...)."""

    def __init__(self, code: int, message: str) -> None:
        self.code = int(code)
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        try:
            name = CUresult(self.code).name
        except ValueError:
            name = f"CUresult({self.code})"
        return f"{name}: {self.message}"


_FAULT_KINDS = {
    "illegal": CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,
    "misaligned": CUresult.CUDA_ERROR_MISALIGNED_ADDRESS,
}


def fault_code(kind: str) -> int:
    """The CUresult for a :class:`~crane.backends.sim.memory.MemoryFault` kind."""
    return int(_FAULT_KINDS.get(kind, CUresult.CUDA_ERROR_ILLEGAL_ADDRESS))
