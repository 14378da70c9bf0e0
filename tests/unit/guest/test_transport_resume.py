"""The guest transport's resume when its session ends between a Resume and the new stream.

A daemon answers Resume for a session whose worker has just been killed but not yet reaped
(the process is still exiting); the stream the guest then opens finds the session reaped and
ends with NOT_FOUND. The guest must ask Resume once more, which now gives the reason, and
report ``CUDA_ERROR_NO_DEVICE`` with it, as it does when the Resume comes after the reaping.
A scripted Guest service plays the daemon so that the order of events is fixed."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from crane.api.errors import TransportError
from crane.api.generated.cuda_enums import CUresult
from crane.guest.transport import MAX_BARE_RESUMES, Transport
from crane.v1 import guest_pb2
from crane.wire.packed import SYNC_OPS

_SID = "5c9c849cb4d0"
_WHY = f"session {_SID} ended: its worker process exited"
_SYNC = next(o for o in SYNC_OPS.values() if o.name == "CTX_SYNCHRONIZE")


class _Script:
    """A Guest service whose call streams break at once: the first with UNAVAILABLE (the
    worker died), every later one with NOT_FOUND (reaped meanwhile). ``resumes_ok`` Resumes
    succeed (the worker still looked alive), the later ones give the reason."""

    def __init__(self, resumes_ok: int) -> None:
        self.resumes_ok = resumes_ok
        self.streams = 0
        self.resumes = 0
        self.lock = threading.Lock()

    def _reply(self) -> guest_pb2.OpenSessionReply:
        return guest_pb2.OpenSessionReply(
            session_id=_SID, resume_token=b"t" * 16, va_base=1 << 40, va_size=1 << 30
        )

    def open_session(self, request: object, context: grpc.ServicerContext) -> object:
        return self._reply()

    def resume(self, request: object, context: grpc.ServicerContext) -> object:
        with self.lock:
            self.resumes += 1
            ok = self.resumes <= self.resumes_ok
        if not ok:
            context.abort(grpc.StatusCode.NOT_FOUND, _WHY)
        return self._reply()

    def calls(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        with self.lock:
            self.streams += 1
            first = self.streams == 1
        if first:
            next(requests)  # the guest's first batch reached a worker that then died
            context.abort(grpc.StatusCode.UNAVAILABLE, "worker socket closed")
        context.abort(grpc.StatusCode.NOT_FOUND, f"no session {_SID!r} on this daemon")
        yield b""  # (a generator: never reached)


@pytest.fixture
def scripted() -> Iterator[tuple[str, _Script]]:
    script = _Script(resumes_ok=1)
    d = tempfile.mkdtemp(prefix="crane-resume-")  # short: a socket path's limit
    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "crane.v1.Guest",
                {
                    "OpenSession": grpc.unary_unary_rpc_method_handler(
                        script.open_session,
                        request_deserializer=guest_pb2.OpenSessionRequest.FromString,
                        response_serializer=guest_pb2.OpenSessionReply.SerializeToString,
                    ),
                    "Resume": grpc.unary_unary_rpc_method_handler(
                        script.resume,
                        request_deserializer=guest_pb2.ResumeRequest.FromString,
                        response_serializer=guest_pb2.OpenSessionReply.SerializeToString,
                    ),
                    "Calls": grpc.stream_stream_rpc_method_handler(script.calls),
                },
            ),
        )
    )
    server.add_insecure_port(f"unix:{d}/g.sock")
    server.start()
    try:
        yield f"unix://{d}/g.sock", script
    finally:
        server.stop(0)
        shutil.rmtree(d, ignore_errors=True)


def test_a_session_reaped_after_its_resume_answered_gives_the_reason(
    scripted: tuple[str, _Script],
) -> None:
    address, script = scripted
    t = Transport(address, direct=False)
    try:
        with pytest.raises(TransportError) as e:
            t.call(_SYNC, 0)
        assert e.value.result == CUresult.CUDA_ERROR_NO_DEVICE, e.value.message
        assert e.value.message == _WHY
        assert script.resumes == 2 and script.streams == 2
    finally:
        t.close()


def test_streams_that_keep_breaking_after_a_resume_end_in_an_error(
    scripted: tuple[str, _Script],
) -> None:
    """A daemon that keeps answering Resume while every new stream breaks: the guest stops
    after MAX_BARE_RESUMES rounds instead of going round forever."""
    address, script = scripted
    script.resumes_ok = 10**6
    t = Transport(address, direct=False)
    try:
        with pytest.raises(TransportError, match="did not stay resumed"):
            t.call(_SYNC, 0)
        assert script.resumes == MAX_BARE_RESUMES + 1
    finally:
        t.close()
