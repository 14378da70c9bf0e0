"""Streams and events: guest-named (creation needs no round trip), queries and waits through
the session, properties answered from what the guest recorded at creation."""

from __future__ import annotations

import struct
from typing import Any

from crane.api.generated.cuda_enums import CUdevice_attribute as DA
from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.interposer import graphs
from crane.interposer.fastlane import FAST
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
    _attrs.pop(h, None)


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
    g = FAST.gen()
    session = RT.session()
    session.check_event(e)
    if flags & _EVENT_WAIT_EXTERNAL:
        if graphs.record(s, graphs.WAIT_EVENT, graphs.EventParams(e)):
            return
    elif graphs.wait_event(s, e):
        return
    session.stream_wait_event(s, e, 0)
    if not flags and graphs.fast_ok():
        FAST.learn(g, session, s, event=e)


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


# ---- attributes ----------------------------------------------------------------------------
# CUstreamAttrID (= CUlaunchAttributeID) values a stream takes; the value is a 64-byte union
_ACCESS_POLICY_WINDOW, _SYNC_POLICY, _PRIORITY, _SYNC_DOMAIN_MAP, _SYNC_DOMAIN = 1, 3, 8, 9, 10
_VALUE_SIZE = 64
_WINDOW = struct.Struct("<QQfii")  # CUaccessPolicyWindow: base, bytes, hitRatio, hitProp, missProp
_attrs: dict[int, dict[int, bytes]] = {}  # stream handle -> attribute -> the value as set


def _attr_stream(stream: Any) -> int:
    h = RT.stream(stream)
    if h not in (0, 1, 2) and h not in RT.streams:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_HANDLE, f"unknown stream {h:#x}")
    return h


def _default_value(h: int, attr: int) -> bytes:
    if attr == _PRIORITY:
        info = RT.streams.get(h)
        return struct.pack("<i", info.priority if info else 0).ljust(_VALUE_SIZE, b"\0")
    if attr == _SYNC_POLICY:
        return struct.pack("<i", 1).ljust(_VALUE_SIZE, b"\0")  # CU_SYNC_POLICY_AUTO
    if attr == _SYNC_DOMAIN_MAP:
        return bytes([0, 1]).ljust(_VALUE_SIZE, b"\0")  # default -> 0, remote -> 1
    return bytes(_VALUE_SIZE)


def _check_value(attr: int, raw: bytes) -> bytes:
    """Validate a value as the driver does; the priority is clamped to the context's range."""
    if attr == _ACCESS_POLICY_WINDOW:
        _base, nbytes, ratio, hit, miss = _WINDOW.unpack_from(raw)
        cap = RT.session().attributes.get(DA.CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE, 0)
        if nbytes > cap or not 0.0 <= ratio <= 1.0 or hit not in (0, 1, 2) or miss not in (0, 1, 2):
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE,
                f"access policy window of {nbytes} bytes (device maximum {cap}), hit ratio "
                f"{ratio}, properties {hit}/{miss}",
            )
        return raw
    if attr == _SYNC_POLICY:
        (policy,) = struct.unpack_from("<i", raw)
        if policy not in (1, 2, 3, 4):
            raise CudaError(
                CUresult.CUDA_ERROR_INVALID_VALUE, f"bad synchronization policy {policy}"
            )
        return raw
    if attr == _PRIORITY:
        (prio,) = struct.unpack_from("<i", raw)
        return struct.pack("<i", max(-5, min(0, prio))).ljust(_VALUE_SIZE, b"\0")
    if attr == _SYNC_DOMAIN:
        if struct.unpack_from("<i", raw)[0] not in (0, 1):
            raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "bad memory synchronization domain")
        return raw
    if attr == _SYNC_DOMAIN_MAP:
        return raw
    raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"stream attribute {attr} is not valid")


@handles("cuStreamSetAttribute@11000")
def stream_set_attribute(stream: Any, attr: int, value: Any) -> None:
    """Recorded per stream and answered back: access-policy windows, synchronization policy and
    memory synchronization domains are performance hints with no effect on results; a priority
    changes the stream's reported priority (stream order on the simulated GPU ignores it)."""
    h = _attr_stream(stream)
    if value == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL attribute value")
    raw = _check_value(attr, bytes(RT.ffi.buffer(RT.ffi.cast("char *", value), _VALUE_SIZE)))
    _attrs.setdefault(h, {})[attr] = raw
    if attr == _PRIORITY and h in RT.streams:
        RT.streams[h].priority = struct.unpack_from("<i", raw)[0]


@handles("cuStreamGetAttribute@11000")
def stream_get_attribute(stream: Any, attr: int, out: Any) -> None:
    h = _attr_stream(stream)
    if out == RT.ffi.NULL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, "NULL output pointer")
    if attr not in (_ACCESS_POLICY_WINDOW, _SYNC_POLICY, _PRIORITY, _SYNC_DOMAIN_MAP, _SYNC_DOMAIN):
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"stream attribute {attr} is not valid")
    # a priority is the stream's own record; the other attributes as set, else defaults
    stored = None if attr == _PRIORITY else _attrs.get(h, {}).get(attr)
    raw = stored or _default_value(h, attr)
    RT.ffi.memmove(RT.ffi.cast("char *", out), raw, _VALUE_SIZE)


@handles("cuStreamCopyAttributes@11000")
def stream_copy_attributes(dst: Any, src: Any) -> None:
    d, s = _attr_stream(dst), _attr_stream(src)
    _attrs[d] = dict(_attrs.get(s, {}))
    if d in RT.streams:
        RT.streams[d].priority = struct.unpack_from("<i", _default_value(s, _PRIORITY))[0]


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
    g = FAST.gen()
    session = RT.session()
    session.check_event(e)
    if not graphs.event_recorded(e, s):
        session.event_record(e, s)
        if graphs.fast_ok():
            FAST.learn(g, session, s, event=e)


@handles("cuEventRecordWithFlags@11010")
def event_record_with_flags(event: Any, stream: Any, flags: int) -> None:
    """Flags 0 is :func:`event_record` (which teaches the fast lane, so the next such call
    is queued by the library's C: ``crane_fast_event_record_flags``)."""
    if flags & ~_EVENT_RECORD_EXTERNAL:
        raise CudaError(CUresult.CUDA_ERROR_INVALID_VALUE, f"bad record flags {flags:#x}")
    if not flags:
        event_record(event, stream)
        return
    e, s = RT.ptr(event), RT.stream(stream)
    RT.session().check_event(e)
    if graphs.record(s, graphs.EVENT_RECORD, graphs.EventParams(e)):
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
