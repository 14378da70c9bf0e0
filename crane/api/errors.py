"""The three kinds of failure, kept apart (each has its own class and its own boundary).

* **CUDA** (:class:`~crane.api.results.CudaError`): a result code the application should see;
  it travels inside replies as a CUresult, never as a gRPC status.
* **Protocol** (:class:`ProtocolError`): what is wrong with a request itself (an unknown
  session, a wrong token, a mismatched build, a state that forbids the operation, a limit). A
  service answers it as a gRPC status, named by :attr:`ProtocolError.status`; the one place
  that turns it into that status is the RPC boundary (:mod:`crane.wire.handlers`).
* **Transport** (:class:`TransportError`): the far end cannot be reached or the stream broke.
  The guest library raises it below its API and turns it into the CUresult the application
  sees (:attr:`TransportError.result`) at the session's boundary.
"""

from __future__ import annotations

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError

__all__ = ["CudaError", "ProtocolError", "TransportError"]


class ProtocolError(Exception):
    """A request refused for what it is; answered with the gRPC status named ``status``.

    ``trailers`` go back as trailing metadata with the status (a redirect, say), so that a
    client can act on the refusal without parsing its text."""

    def __init__(
        self, status: str, message: str, trailers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(message)
        self.status = status  # a grpc.StatusCode name
        self.message = message
        self.trailers = trailers


class TransportError(Exception):
    """The daemon cannot be reached, or a session's stream broke.

    ``result`` is what the application is told when this ends a CUDA call (for example
    CUDA_ERROR_NO_DEVICE when no daemon answers)."""

    def __init__(self, result: CUresult, message: str) -> None:
        super().__init__(int(result), message)
        self.result = result
        self.message = message

    def __str__(self) -> str:
        return f"{self.result.name}: {self.message}"

    def as_cuda_error(self) -> CudaError:
        """The failure as the CUDA API reports it."""
        return CudaError(self.result, self.message)
