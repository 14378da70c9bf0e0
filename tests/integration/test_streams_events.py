"""Streams keep order, events time and order work across streams."""

from __future__ import annotations

import numpy as np
import pytest

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.guest.session import GuestSession

N = 1 << 18


def test_in_order_within_a_stream(session: GuestSession) -> None:
    s = session.stream_create()
    a, b = session.mem_alloc(4 * N), session.mem_alloc(4 * N)
    for v in range(1, 50):  # each step depends on the previous one
        session.memset_d32(a, v, N, s)
        session.memcpy_dtod(b, a, 4 * N, s)
    session.stream_synchronize(s)
    assert session.stream_query(s)
    assert set(np.frombuffer(session.memcpy_dtoh(b, 4 * N, s), np.uint32)) == {49}


def test_wait_event_orders_across_streams(session: GuestSession) -> None:
    s1, s2 = session.stream_create(), session.stream_create(flags=1, priority=-1)
    x, y = session.mem_alloc(4 * N), session.mem_alloc(4 * N)
    ev = session.event_create()
    session.memset_d32(x, 7, N, s1)
    session.event_record(ev, s1)
    session.stream_wait_event(s2, ev)
    session.memcpy_dtod(y, x, 4 * N, s2)
    session.stream_synchronize(s2)
    assert session.event_query(ev)
    assert set(np.frombuffer(session.memcpy_dtoh(y, 4 * N), np.uint32)) == {7}


def test_event_timing(session: GuestSession) -> None:
    s = session.stream_create()
    e0, e1, e2 = (session.event_create() for _ in range(3))
    buf = session.mem_alloc(64 << 20)
    session.event_record(e0, s)
    session.memset_d8(buf, 1, 64 << 20, s)
    session.event_record(e1, s)
    for _ in range(20):
        session.memset_d8(buf, 2, 64 << 20, s)
    session.event_record(e2, s)
    session.event_synchronize(e2)
    t01, t02 = session.event_elapsed(e0, e1), session.event_elapsed(e0, e2)
    assert 0 <= t01 < t02
    assert session.event_elapsed(e1, e0) == pytest.approx(-t01)


def test_timing_errors(session: GuestSession) -> None:
    quiet, never = session.event_create(flags=2), session.event_create()  # DISABLE_TIMING
    session.event_record(quiet)
    with pytest.raises(CudaError) as e:
        session.event_elapsed(quiet, quiet)
    assert e.value.code == CUresult.CUDA_ERROR_INVALID_HANDLE
    with pytest.raises(CudaError) as e:
        session.event_elapsed(never, never)
    assert e.value.code == CUresult.CUDA_ERROR_INVALID_HANDLE


def test_destroyed_objects_are_invalid(session: GuestSession) -> None:
    s, ev = session.stream_create(), session.event_create()
    session.stream_destroy(s)
    session.event_destroy(ev)
    with pytest.raises(CudaError) as e:
        session.stream_synchronize(s)
    assert e.value.code == CUresult.CUDA_ERROR_INVALID_HANDLE
    with pytest.raises(CudaError):
        session.event_record(ev)
    session.stream_synchronize(0)  # the default stream is always there


def test_context_destroy_releases_its_objects(session: GuestSession) -> None:
    ctx = session.ctx_create()
    addr = session.mem_alloc(1 << 20, ctx=ctx)
    s = session.stream_create(ctx=ctx)
    session.ctx_destroy(ctx)
    session.synchronize()
    # The daemon freed the context's allocation and stream; raw calls prove it.
    from crane.api.ops import OPS_BY_NAME as O

    t = session._t
    seq = t.enqueue(O["STREAM_SYNCHRONIZE"], O["STREAM_SYNCHRONIZE"].pack(s), expect=True)
    assert t.wait(seq).result == CUresult.CUDA_ERROR_INVALID_HANDLE
    seq = t.enqueue(O["MEMCPY_DTOH"], O["MEMCPY_DTOH"].pack(addr, 4, 0), expect=True)
    assert t.wait(seq).result == CUresult.CUDA_ERROR_INVALID_VALUE
