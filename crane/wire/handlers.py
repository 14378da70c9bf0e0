"""gRPC method handlers for protobuf request/reply pairs, spelled once for every service."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

__all__ = ["unary", "unary_stream"]


def unary(fn: Callable[..., Any], req: Any, rep: Any) -> grpc.RpcMethodHandler:
    """A unary-unary method taking ``req`` messages and answering ``rep`` messages."""
    return grpc.unary_unary_rpc_method_handler(
        fn, request_deserializer=req.FromString, response_serializer=rep.SerializeToString
    )


def unary_stream(fn: Callable[..., Any], req: Any, rep: Any) -> grpc.RpcMethodHandler:
    """A unary-stream method taking one ``req`` and streaming ``rep`` messages."""
    return grpc.unary_stream_rpc_method_handler(
        fn, request_deserializer=req.FromString, response_serializer=rep.SerializeToString
    )
