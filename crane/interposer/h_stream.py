"""Streams and events: guest-named (creation needs no round trip), queries and waits through
the session, properties answered from what the guest recorded at creation."""

from __future__ import annotations

from typing import Any

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.interposer import graphs
from crane.interposer.registry import handles
from crane.interposer.runtime import RT, StreamInfo

_EVENT_WAIT_EXTERNAL = 1  # CU_EVENT_WAIT_EXTERNAL: an event wait node during capture
_EVENT_RECORD_EXTERNAL = 1  # CU_EVENT_RECORD_EXTERNAL: an event record node during capture


def _create(out: Any, flags: int, priority: int) -> None:
    if out == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL stream pointer")
    if flags & ~1:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad stream flags {flags:#x}")
    ctx = RT.ctx()
    priority = max(-5, min(0, priority))
    h = RT.session().stream_create(flags, priority, ctx)
    RT.streams[h] = StreamInfo(RT.ptr(RT.lib.crane_ctx_current()), flags, priority)
    out[0] = RT.ffi.cast("void *", h)


@handles("cuStreamCreate@2000")
def stream_create(out: Any, flags: int) -> None:
    _create(out, flags, 0)


@handles("cuStreamCreateWithPriority@5050")
def stream_create_with_priority(out: Any, flags: int, priority: int) -> None:
    _create(out, flags, priority)


@handles("cuStreamDestroy@4000")
def stream_destroy(stream: Any) -> None:
    h = RT.ptr(stream)
    RT.session().stream_destroy(h)
    RT.streams.pop(h, None)


@handles("cuStreamSynchronize@2000")
def stream_synchronize(stream: Any) -> None:
    s = RT.stream(stream)
    graphs.check_sync(s, "cuStreamSynchronize")
    RT.session().stream_synchronize(s)


@handles("cuStreamQuery@2000")
def stream_query(stream: Any) -> None:
    s = RT.stream(stream)
    graphs.check_sync(s, "cuStreamQuery")
    if not RT.session().stream_query(s):
        raise CudaError(CUresult.CUDA_ERROR_NOT_READY, "stream busy")


@handles("cuStreamWaitEvent@3020")
def stream_wait_event(stream: Any, event: Any, flags: int) -> None:
    s, e = RT.stream(stream), RT.ptr(event)
    if flags & ~_EVENT_WAIT_EXTERNAL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad wait flags {flags:#x}")
    RT.session().check_event(e)
    if flags & _EVENT_WAIT_EXTERNAL:
        if graphs.record(s, graphs.WAIT_EVENT, graphs.EventParams(e)):
            return
    elif graphs.wait_event(s, e):
        return
    RT.session().stream_wait_event(s, e, 0)


def _info(stream: Any) -> StreamInfo | None:
    h = RT.stream(stream)
    if h in (0, 1, 2):
        return None
    info = RT.streams.get(h)
    if info is None:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, f"unknown stream {h:#x}")
    return info


@handles("cuStreamGetFlags@5050")
def stream_get_flags(stream: Any, out: Any) -> None:
    info = _info(stream)
    RT.out(out, info.flags if info else 0)


@handles("cuStreamGetPriority@5050")
def stream_get_priority(stream: Any, out: Any) -> None:
    info = _info(stream)
    RT.out(out, info.priority if info else 0)


@handles("cuStreamGetCtx@9020")
def stream_get_ctx(stream: Any, out: Any) -> None:
    info = _info(stream)
    ctx = info.ctx if info else RT.ptr(RT.lib.crane_ctx_current())
    if not ctx:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_CONTEXT, "no current context")
    RT.out(out, RT.ffi.cast("void *", ctx))


@handles("cuStreamGetId@12000")
def stream_get_id(stream: Any, out: Any) -> None:
    _info(stream)
    RT.out(out, RT.stream(stream))


# ---- events --------------------------------------------------------------------------------
@handles("cuEventCreate@2000")
def event_create(out: Any, flags: int) -> None:
    if out == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL event pointer")
    if flags & ~0xF:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad event flags {flags:#x}")
    out[0] = RT.ffi.cast("void *", RT.session().event_create(flags, RT.ctx()))


@handles("cuEventDestroy@4000")
def event_destroy(event: Any) -> None:
    RT.session().event_destroy(RT.ptr(event))


@handles("cuEventRecord@2000")
def event_record(event: Any, stream: Any) -> None:
    e, s = RT.ptr(event), RT.stream(stream)
    RT.session().check_event(e)
    if not graphs.event_recorded(e, s):
        RT.session().event_record(e, s)


@handles("cuEventRecordWithFlags@11010")
def event_record_with_flags(event: Any, stream: Any, flags: int) -> None:
    e, s = RT.ptr(event), RT.stream(stream)
    if flags & ~_EVENT_RECORD_EXTERNAL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad record flags {flags:#x}")
    RT.session().check_event(e)
    if flags & _EVENT_RECORD_EXTERNAL:
        if graphs.record(s, graphs.EVENT_RECORD, graphs.EventParams(e)):
            return
    elif graphs.event_recorded(e, s):
        return
    RT.session().event_record(e, s)


@handles("cuEventSynchronize@2000")
def event_synchronize(event: Any) -> None:
    graphs.check_event(RT.ptr(event), "cuEventSynchronize")
    RT.session().event_synchronize(RT.ptr(event))


@handles("cuEventQuery@2000")
def event_query(event: Any) -> None:
    graphs.check_event(RT.ptr(event), "cuEventQuery")
    if not RT.session().event_query(RT.ptr(event)):
        raise CudaError(CUresult.CUDA_ERROR_NOT_READY, "event not reached")


@handles("cuEventElapsedTime@2000", "cuEventElapsedTime@12080")
def event_elapsed_time(out: Any, start: Any, end: Any) -> None:
    RT.out(out, RT.session().event_elapsed(RT.ptr(start), RT.ptr(end)))
