"""CUresult helpers: the exception Crane raises for driver errors, and name/description lookup.

Why here and not in the shim: both sides of the wire turn result codes into errors and back
(the host daemon when the real driver fails, the guest when a reply carries a failure), and
the guest answers cuGetErrorName / cuGetErrorString locally.  All of them must agree, so the
lookup lives in one small module built on the enum mirrored from cuda.h.

Note: ``error_string`` returns cuda.h's doxygen description.  The real libcuda returns a
shorter phrase (e.g. "invalid argument"); the header does not ship those phrases.
"""

from __future__ import annotations

from crane.api.generated.cuda_enums import RESULT_DESCRIPTIONS, CUresult

__all__ = [
    "STICKY",
    "CUresult",
    "CudaError",
    "error_name",
    "error_string",
    "raise_for_result",
    "to_result",
]


def to_result(code: int) -> CUresult:
    """Return ``code`` as a ``CUresult``; ``ValueError`` if cuda.h defines no such code."""
    try:
        return CUresult(code)
    except ValueError:
        raise ValueError(f"{code} is not a CUresult defined by cuda.h") from None


def error_name(code: int) -> str:
    """The enumerator name of ``code``, as cuGetErrorName reports it (``CUDA_ERROR_...``).

    Raises ``ValueError`` for codes cuda.h does not define (the real cuGetErrorName then
    returns CUDA_ERROR_INVALID_VALUE).
    """
    return to_result(code).name


def error_string(code: int) -> str:
    """The description of ``code`` from cuda.h; ``ValueError`` for unknown codes."""
    return RESULT_DESCRIPTIONS[to_result(code)]


#: Hardware exceptions after which a context is unusable until it is destroyed or reset, as on a
#: GPU: the worker fails every later call with them, the guest library knows them locally.
STICKY = frozenset(
    {
        CUresult.CUDA_ERROR_ILLEGAL_ADDRESS,
        CUresult.CUDA_ERROR_MISALIGNED_ADDRESS,
        CUresult.CUDA_ERROR_ILLEGAL_INSTRUCTION,
        CUresult.CUDA_ERROR_LAUNCH_FAILED,
        CUresult.CUDA_ERROR_ASSERT,
        CUresult.CUDA_ERROR_HARDWARE_STACK_ERROR,
        CUresult.CUDA_ERROR_INVALID_PC,
        CUresult.CUDA_ERROR_INVALID_ADDRESS_SPACE,
        # a watchdog (a display's, or a tenant's kernel time limit) ended a kernel
        CUresult.CUDA_ERROR_LAUNCH_TIMEOUT,
    }
)


class CudaError(Exception):
    """A CUDA driver call failed with a non-success ``CUresult``.

    ``code`` is a ``CUresult`` when cuda.h defines the value; a code from a newer driver that
    this header does not know stays a plain ``int`` so it can still be passed back unchanged.
    ``message`` is the caller's context if given, otherwise the header's description.
    """

    code: CUresult | int
    message: str

    def __init__(self, code: int, message: str | None = None) -> None:
        try:
            self.code = to_result(code)
        except ValueError:
            self.code = int(code)
        if message is None:
            known = isinstance(self.code, CUresult)
            message = error_string(self.code) if known else "unrecognized CUresult"
        self.message = message
        super().__init__(int(self.code), message)

    @property
    def name(self) -> str:
        """``CUDA_ERROR_...`` name of the code, or ``CUresult(<n>)`` for unknown codes."""
        return self.code.name if isinstance(self.code, CUresult) else f"CUresult({self.code})"

    def __str__(self) -> str:
        return f"{self.name} ({int(self.code)}): {self.message}"

    def __reduce__(self) -> tuple[type[CudaError], tuple[int, str]]:
        # Keep errors picklable across process boundaries (workers, multiprocessing).
        return (type(self), (int(self.code), self.message))


def raise_for_result(code: int, message: str | None = None) -> None:
    """Raise ``CudaError`` unless ``code`` is ``CUDA_SUCCESS``."""
    if code != CUresult.CUDA_SUCCESS:
        raise CudaError(code, message)
