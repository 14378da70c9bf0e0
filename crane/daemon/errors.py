"""Errors the daemon reports to a client as a gRPC status (protocol-level failures).

CUDA failures never take this path: they travel inside replies as CUresult codes. This is for
what is wrong with the request itself (unknown session, bad token, mismatched build, limits).
"""

__all__ = ["DaemonError"]


class DaemonError(Exception):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status  # a grpc.StatusCode name
        self.message = message
