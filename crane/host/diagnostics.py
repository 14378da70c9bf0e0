"""Transport diagnostics (``crane.v1.Diagnostics``): the bare gRPC floor, served next to real
call streams by the daemon and by every session worker, so that an operator or a benchmark can
compare Crane's call path with plain gRPC on the very same server and socket (one service both
host processes serve, so it lives with what they share)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc

from crane.v1 import diag_pb2
from crane.wire.handlers import stream_stream, stream_unary, unary_stream
from crane.wire.status import MAX_CHUNK

__all__ = ["DiagnosticsServicer", "diagnostics_handler"]


class DiagnosticsServicer:
    """The transport floor, measured on the same server and socket as guests' streams.
    ``authorize(context)`` refuses a caller that may not use it (craned: operators only; a
    worker's endpoint is reachable only through its session's socket)."""

    def __init__(self, authorize: Callable[[grpc.ServicerContext], object] | None = None) -> None:
        self.authorize = authorize or (lambda _context: None)

    def Echo(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        self.authorize(context)
        yield from requests

    def Drain(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Any:
        self.authorize(context)
        total = count = 0
        for raw in requests:
            total += len(raw)
            count += 1
        return diag_pb2.DrainReply(bytes=total, messages=count)

    def Source(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.authorize(context)
        size = min(request.size, MAX_CHUNK * 4)
        blob = diag_pb2.Blob(payload=bytes(size)).SerializeToString()
        for _ in range(min(request.count, 1 << 20)):
            yield blob


def diagnostics_handler(servicer: DiagnosticsServicer) -> grpc.GenericRpcHandler:
    """Raw bytes in and out, like ``Calls``: the baseline pays what the relay pays, no more."""
    return grpc.method_handlers_generic_handler(
        "crane.v1.Diagnostics",
        {
            "Echo": stream_stream(servicer.Echo),
            "Drain": stream_unary(servicer.Drain, None, diag_pb2.DrainReply),
            "Source": unary_stream(servicer.Source, diag_pb2.SourceRequest, None),
        },
    )
