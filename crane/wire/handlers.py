"""gRPC method handlers, spelled once for every service, and the one error boundary of them all.

Every method of every service Crane serves (Guest, Control, Peer, Migration, Diagnostics, and a
worker's own Guest endpoint) is registered through :func:`unary`, :func:`unary_stream`,
:func:`stream_unary` or :func:`stream_stream`, which wrap it in :func:`boundary`: the only place
where an exception becomes a gRPC status. A :class:`~crane.api.errors.ProtocolError` becomes its
status (with its trailers) and a log line naming the method, the peer and the reason; anything
else is a bug, logged with its traceback and answered INTERNAL, so a client always gets a
status that says what happened and the server carries on. A ``grpc.RpcError`` raised by the
call itself (a streaming client that went away, read from its request iterator) is gRPC's own
business and passes through. Handlers never call ``context.abort`` themselves.

Each call also runs in a :class:`contextvars.Context` of its own, every step of a streaming
one included: gRPC reuses its threads, and what a handler binds there (the session its log
lines are about, :mod:`crane.host.logs`) must end with the call, not leak into the next.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import grpc

from crane.api.errors import ProtocolError

__all__ = ["boundary", "stream_stream", "stream_unary", "unary", "unary_stream"]

log = logging.getLogger("crane.rpc")


def _refuse(name: str, context: grpc.ServicerContext, e: Exception) -> NoReturn:
    if isinstance(e, ProtocolError):
        log.warning("%s refused for %s: %s", name, context.peer(), e.message)
        if e.trailers:
            context.set_trailing_metadata(e.trailers)
        context.abort(getattr(grpc.StatusCode, e.status), e.message)
    log.error("%s failed for %s", name, context.peer(), exc_info=e)
    context.abort(grpc.StatusCode.INTERNAL, f"internal error in {name}: {e!r}")


def boundary(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a unary or streaming method) with its exceptions turned into gRPC status."""
    name = fn.__name__
    if inspect.isgeneratorfunction(fn):

        def guarded(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                yield from fn(request, context)
            except grpc.RpcError:
                raise  # the call itself ended (the client went away): gRPC's own business
            except Exception as e:
                _refuse(name, context, e)

        @functools.wraps(fn)
        def streaming(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            own = contextvars.Context()
            steps = guarded(request, context)
            try:
                while True:
                    try:
                        item = own.run(next, steps)
                    except StopIteration:
                        return
                    yield item
            finally:  # the stream ended early (closed, collected): its handler's finally runs
                own.run(steps.close)

        return streaming

    def guarded_single(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return fn(request, context)
        except grpc.RpcError:
            raise  # the call itself ended (the client went away): gRPC's own business
        except Exception as e:
            _refuse(name, context, e)

    @functools.wraps(fn)
    def single(request: Any, context: grpc.ServicerContext) -> Any:
        return contextvars.Context().run(guarded_single, request, context)

    return single


def _codec(req: Any, rep: Any) -> dict[str, Any]:
    """Serializers for protobuf classes; None for either side: raw bytes pass through."""
    return {
        "request_deserializer": req.FromString if req is not None else None,
        "response_serializer": rep.SerializeToString if rep is not None else None,
    }


def unary(fn: Callable[..., Any], req: Any, rep: Any) -> grpc.RpcMethodHandler:
    """A unary-unary method taking ``req`` messages and answering ``rep`` messages."""
    return grpc.unary_unary_rpc_method_handler(boundary(fn), **_codec(req, rep))


def unary_stream(fn: Callable[..., Any], req: Any, rep: Any) -> grpc.RpcMethodHandler:
    """A unary-stream method taking one ``req`` and streaming ``rep`` messages."""
    return grpc.unary_stream_rpc_method_handler(boundary(fn), **_codec(req, rep))


def stream_unary(fn: Callable[..., Any], req: Any, rep: Any) -> grpc.RpcMethodHandler:
    """A stream-unary method taking ``req`` messages and answering one ``rep``."""
    return grpc.stream_unary_rpc_method_handler(boundary(fn), **_codec(req, rep))


def stream_stream(
    fn: Callable[..., Any],
    req: Any = None,
    rep: Any = None,
    *,
    request_deserializer: Callable[[bytes], Any] | None = None,
) -> grpc.RpcMethodHandler:
    """A stream-stream method; ``req``/``rep`` None carry raw bytes (a relay never parses
    them); ``request_deserializer`` replaces ``req.FromString`` (a zero-copy parser)."""
    codec = _codec(req, rep)
    if request_deserializer is not None:
        codec["request_deserializer"] = request_deserializer
    return grpc.stream_stream_rpc_method_handler(boundary(fn), **codec)
