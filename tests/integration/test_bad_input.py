"""Bad input gets the right CUDA error and a daemon log line; the daemon carries on.

Most of these bypass the guest library's own checks (which would refuse them locally) by
sending raw calls, because the daemon must never trust a guest.
"""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from crane.api.generated.cuda_enums import CUresult
from crane.api.ops import OPS_BY_NAME as O
from crane.api.results import CudaError
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.v1 import guest_pb2, guest_pb2_grpc, peer_pb2, peer_pb2_grpc
from crane.wire.channel import open_channel
from crane.wire.fingerprint import fingerprint


def raw(session: GuestSession, name: str, *args: object, data: bytes = b"") -> int:
    """Send one call past the guest library's checks; return the daemon's result code."""
    op = O[name]
    seq = session._t.enqueue(op, op.pack(*args), data, expect=True)
    reply = session._t.wait(seq)
    return reply.result


def test_unknown_handles(session: GuestSession, daemon: DaemonProcess) -> None:
    bogus = 0xC4_0000_0000_0999
    assert raw(session, "STREAM_SYNCHRONIZE", bogus) == CUresult.CUDA_ERROR_INVALID_HANDLE
    assert raw(session, "EVENT_SYNCHRONIZE", bogus) == CUresult.CUDA_ERROR_INVALID_HANDLE
    assert raw(session, "CTX_SYNCHRONIZE", 12345) == CUresult.CUDA_ERROR_INVALID_CONTEXT
    assert "unknown stream handle" in daemon.log_text()
    # locally validated too, without a round trip
    with pytest.raises(CudaError) as e:
        session.stream_synchronize(bogus)
    assert e.value.code == CUresult.CUDA_ERROR_INVALID_HANDLE


def test_pointers_outside_allocations_and_overruns(
    session: GuestSession, daemon: DaemonProcess
) -> None:
    a = session.mem_alloc(1000)
    assert raw(session, "MEMCPY_DTOH", a, 1001, 0) == CUresult.CUDA_ERROR_INVALID_VALUE
    assert raw(session, "MEMCPY_DTOH", a + 4096, 4, 0) == CUresult.CUDA_ERROR_INVALID_VALUE
    assert raw(session, "MEMCPY_DTOH", 0x10, 4, 0) == CUresult.CUDA_ERROR_INVALID_VALUE
    assert raw(session, "MEMSET", a + 999, 0, 4, 1, 0) == CUresult.CUDA_ERROR_INVALID_VALUE
    assert raw(session, "MEM_FREE", a + 8) == CUresult.CUDA_ERROR_INVALID_VALUE
    assert "runs 1 bytes past the allocation" in daemon.log_text()
    with pytest.raises(CudaError) as e:
        session.memcpy_htod(a, bytes(1001))
    assert e.value.code == CUresult.CUDA_ERROR_INVALID_VALUE
    session.memcpy_htod(a, b"x" * 1000)
    assert session.memcpy_dtoh(a, 1000) == b"x" * 1000


def test_async_error_surfaces_at_next_sync(session: GuestSession) -> None:
    a = session.mem_alloc(64)
    op = O["MEMCPY_HTOD"]
    session._t.enqueue(op, op.pack(a + 60, 0), b"12345678", expect=False)  # overruns by 4
    with pytest.raises(CudaError) as e:
        session.synchronize()
    assert e.value.code == CUresult.CUDA_ERROR_INVALID_VALUE
    session.synchronize()  # reported once, not sticky


def test_malformed_arguments_and_unknown_ops(session: GuestSession) -> None:
    t = session._t
    seq = t.enqueue(O["MEMCPY_DTOH"], b"\x01\x02", expect=True)
    assert t.wait(seq).result == CUresult.CUDA_ERROR_INVALID_VALUE

    class Fake:
        id, name = 9999, "NOPE"

    seq = t.enqueue(Fake, b"", expect=True)  # type: ignore[arg-type]
    assert t.wait(seq).result == CUresult.CUDA_ERROR_NOT_SUPPORTED
    session.synchronize()


def _raw_stream(daemon: DaemonProcess):  # type: ignore[no-untyped-def]
    ch = open_channel(daemon.address)
    opened = guest_pb2_grpc.GuestStub(ch).OpenSession(
        guest_pb2.OpenSessionRequest(fingerprint=fingerprint(), client="raw")
    )
    calls = ch.stream_stream(
        "/crane.v1.Guest/Calls",
        request_serializer=None,
        response_deserializer=guest_pb2.ReplyBatch.FromString,
    )
    md = (("crane-session", opened.session_id), ("crane-token-bin", opened.resume_token))
    return ch, opened, calls, md


def test_malformed_protobuf_is_answered_and_session_continues(daemon: DaemonProcess) -> None:
    ch, _opened, calls, md = _raw_stream(daemon)
    ok = guest_pb2.CallBatch(flags=1, calls=[guest_pb2.Call(seq=1, op=O["MEM_GET_INFO"].id)])
    replies = calls(iter([b"\xff\xff\xff\xff", ok.SerializeToString()]), metadata=md)
    first = next(replies)
    assert first.replies[0].seq == 0
    assert first.replies[0].result == CUresult.CUDA_ERROR_INVALID_VALUE
    second = next(replies)
    assert second.replies[0].result == 0 and second.done_seq == 1
    ch.close()
    assert "malformed call batch" in daemon.log_text()


def test_wrong_token_and_unknown_session_are_refused(daemon: DaemonProcess) -> None:
    ch, opened, calls, _md = _raw_stream(daemon)
    bad = (("crane-session", opened.session_id), ("crane-token-bin", b"0" * 16))
    with pytest.raises(grpc.RpcError) as e:
        next(calls(iter([b""]), metadata=bad))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as e:
        next(calls(iter([b""]), metadata=(("crane-session", "nope"),)))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    ch.close()


def test_fingerprint_mismatch_is_refused(daemon: DaemonProcess) -> None:
    with (
        open_channel(daemon.address) as ch,
        pytest.raises(grpc.RpcError) as e,
    ):
        guest_pb2_grpc.GuestStub(ch).OpenSession(guest_pb2.OpenSessionRequest(fingerprint="0" * 16))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "different Crane builds" in e.value.details()


def test_a_migration_from_another_build_is_refused(daemon: DaemonProcess) -> None:
    """Daemons speak the Peer protocol to each other: its fingerprint is checked too."""
    with open_channel(daemon.address) as ch:
        stub = peer_pb2_grpc.PeerStub(ch)
        ok = stub.Preflight(peer_pb2.PreflightRequest(slot=1, fingerprint=fingerprint()))
        assert not ok.refusals
        other = stub.Preflight(peer_pb2.PreflightRequest(slot=1, fingerprint="0" * 16))
    assert "protocol fingerprint mismatch" in other.refusals[0], other.refusals
    assert "different Crane builds" in other.refusals[0]


def test_truncated_stream_reaps_the_session(daemon: DaemonProcess) -> None:
    from crane.cli.control_client import ControlClient

    ch, opened, calls, md = _raw_stream(daemon)
    chunk = guest_pb2.CallBatch(
        flags=1,
        calls=[
            guest_pb2.Call(
                seq=1,
                op=O["MEM_MAP_CHUNK"].id,
                args=O["MEM_MAP_CHUNK"].pack(opened.va_base, 64 << 20),
            ),
        ],
    ).SerializeToString()
    replies = calls(iter([chunk]), metadata=md)
    assert next(replies).replies[0].result == 0
    replies.cancel()  # the guest vanishes mid-stream
    ch.close()
    with ControlClient(daemon.address) as ctl:
        deadline = time.monotonic() + 10
        while ctl.sessions().sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not ctl.sessions().sessions
        assert ctl.devices().devices[0].used_mem == 0


def test_daemon_survives_and_serves_others(daemon: DaemonProcess) -> None:
    with GuestSession(daemon.address) as s:
        a = s.mem_alloc(16)
        s.memcpy_htod(a, np.arange(4, dtype=np.uint32))
        assert np.array_equal(np.frombuffer(s.memcpy_dtoh(a, 16), np.uint32), np.arange(4))


@pytest.mark.parametrize("flags", [1, 0], ids=["synchronizing", "asynchronous"])
def test_a_relayed_batch_that_closes_its_session_ends_the_stream(
    daemon: DaemonProcess, flags: int
) -> None:
    """Found by the fuzzer (tests/fuzz): SESSION_CLOSE followed by more calls in one relayed
    batch left the guest's stream open (and a daemon thread on it) until the guest sent another
    batch; the stream must end once the session is over, the close's answer delivered first."""
    from tests.fuzz.rawguest import RawSession, StreamEnded

    s = RawSession(daemon.address, direct=False)
    try:
        close, probe = O["SESSION_CLOSE"], O["MEM_GET_INFO"]
        b = guest_pb2.CallBatch(flags=flags)
        b.calls.add(seq=1, op=close.id)
        b.calls.add(seq=2, op=probe.id)
        s.send(b.SerializeToString())
        with pytest.raises(StreamEnded):
            s.wait_for(2, timeout=10)
        deadline = time.monotonic() + 10
        while daemon_sessions(daemon) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert daemon_sessions(daemon) == []
    finally:
        s.close()


def daemon_sessions(daemon: DaemonProcess) -> list[str]:
    from crane.cli.control_client import ControlClient

    with ControlClient(daemon.address) as c:
        return [x.id for x in c.sessions().sessions]
