"""Transport, protocol and CUDA failures are distinct classes, each turned into what its
audience understands at one boundary."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from crane.api.errors import ProtocolError, TransportError
from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.wire.handlers import boundary


def test_the_three_kinds_do_not_share_a_class() -> None:
    for a, b in ((TransportError, CudaError), (ProtocolError, CudaError)):
        assert not issubclass(a, b) and not issubclass(b, a)
    assert not issubclass(TransportError, ProtocolError)
    e = TransportError(CUresult.CUDA_ERROR_NO_DEVICE, "no daemon")
    assert e.as_cuda_error().code is CUresult.CUDA_ERROR_NO_DEVICE


def test_the_guest_session_reports_a_missing_daemon_as_a_cuda_error(tmp_path: Path) -> None:
    from crane.guest.session import GuestSession

    with pytest.raises(CudaError) as e:
        GuestSession(f"unix://{tmp_path}/nobody.sock")
    assert e.value.code is CUresult.CUDA_ERROR_NO_DEVICE
    assert isinstance(e.value.__cause__, TransportError)


class _Context:
    def __init__(self) -> None:
        self.trailers: tuple = ()

    def peer(self) -> str:
        return "unix:test"

    def set_trailing_metadata(self, md: tuple) -> None:
        self.trailers = md

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _Aborted(code, details)


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details


def test_the_rpc_boundary_turns_refusals_and_bugs_into_status() -> None:
    def refuse(request: object, context: object) -> None:
        raise ProtocolError("NOT_FOUND", "no session", trailers=(("crane-moved-to", "x"),))

    def crash(request: object, context: object) -> None:
        raise KeyError("bug")

    def stream(request: object, context: object):  # type: ignore[no-untyped-def]
        yield 1
        raise ProtocolError("UNAVAILABLE", "parked")

    ctx = _Context()
    with pytest.raises(_Aborted) as e:
        boundary(refuse)(None, ctx)
    assert e.value.code is grpc.StatusCode.NOT_FOUND and e.value.details == "no session"
    assert ctx.trailers == (("crane-moved-to", "x"),)
    with pytest.raises(_Aborted) as e:
        boundary(crash)(None, ctx)
    assert e.value.code is grpc.StatusCode.INTERNAL and "KeyError" in e.value.details
    out = []
    with pytest.raises(_Aborted) as e:
        for item in boundary(stream)(None, ctx):
            out.append(item)
    assert out == [1] and e.value.code is grpc.StatusCode.UNAVAILABLE


def test_a_call_that_ended_is_not_reported_as_a_bug() -> None:
    """A streaming client that goes away raises grpc.RpcError out of its request iterator:
    that passes through the boundary untouched (no INTERNAL status, no traceback logged)."""

    class Ended(grpc.RpcError):
        pass

    def stream(request: object, context: object):  # type: ignore[no-untyped-def]
        yield 1
        raise Ended()

    ctx = _Context()
    with pytest.raises(Ended):
        list(boundary(stream)(None, ctx))
