"""Entries for sessions that left a daemon expire: a parked session not restored in time (its
waiting guest then fails at once, with a clear error, instead of waiting out its own patience)
and a migrated session's redirect. ``crane ps`` lists both until then. Short TTLs here."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.cli.control_client import ControlClient
from crane.cli.migrate import migrate
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.v1 import guest_pb2, guest_pb2_grpc
from crane.wire.channel import open_channel
from crane.wire.fingerprint import fingerprint


def _resume(address: str, sid: str, token: bytes) -> grpc.RpcError:
    with open_channel(address) as ch:
        stub = guest_pb2_grpc.GuestStub(ch)
        req = guest_pb2.ResumeRequest(session_id=sid, resume_token=token, fingerprint=fingerprint())
        with pytest.raises(grpc.RpcError) as e:
            stub.Resume(req, timeout=10)
    return e.value


def _infos(address: str) -> dict:
    with ControlClient(address) as c:
        return {s.id: s for s in c.sessions().sessions}


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "relay"])
def test_parked_entry_expires_and_the_waiting_guest_fails_at_once(
    tmp_path: Path, direct: bool
) -> None:
    ttl = 3.0
    with DaemonProcess(
        tmp_path / "d", extra_args=["--parked-ttl", str(ttl)], checkpoint_dir=tmp_path
    ) as d:
        s = GuestSession(d.address, client="waits", direct=direct)
        try:
            p = s.mem_alloc(1 << 20)
            s.memset_d8(p, 7, 1 << 20)
            s.synchronize()
            ckpt = tmp_path / "p.ckpt"
            with ControlClient(d.address, timeout=None) as c:
                assert c.checkpoint(s.session_id, str(ckpt), release=True).state == "parked"
            parked_at = time.monotonic()
            info = _infos(d.address)[s.session_id]
            assert info.state == "parked"
            assert str(ckpt) in info.location and "expires in" in info.location
            outcome: list[BaseException | None] = []

            def guest() -> None:
                try:
                    s.memcpy_dtoh(p, 16)  # waits while parked
                    outcome.append(None)
                except BaseException as e:  # the point of the test
                    outcome.append(e)

            t = threading.Thread(target=guest, daemon=True)
            t.start()
            time.sleep(1.0)
            assert not outcome  # parked: the guest waits
            t.join(30)  # its own patience is 600 s: it must not wait that out
            assert outcome, "the guest still waits after its parked entry expired"
            failed_after = time.monotonic() - parked_at
            err = outcome[0]
            assert isinstance(err, CudaError), err
            assert err.code == CUresult.CUDA_ERROR_NO_DEVICE, err
            assert "expired" in err.message and f"parked_ttl_s={ttl:g}" in err.message, err
            assert ttl <= failed_after < ttl + 10
            log = d.log_text()
            assert f"session {s.session_id}: parked to {ckpt}" in log
            assert "its entry expired" in log
            assert s.session_id not in _infos(d.address)  # gone from crane ps, slot freed
            e = _resume(d.address, s.session_id, s._t.opened.resume_token)
            assert e.code() == grpc.StatusCode.NOT_FOUND and "expired" in e.details()
            e = _resume(d.address, s.session_id, b"wrong token")
            assert e.code() == grpc.StatusCode.PERMISSION_DENIED
            # the file is kept: an operator can still restore it (a new entry)
            with ControlClient(d.address, timeout=None) as c:
                c.restore(str(ckpt))
            assert _infos(d.address)[s.session_id].state == "ready"
        finally:
            s.close()


def test_restored_in_time_is_not_expired(tmp_path: Path) -> None:
    with DaemonProcess(
        tmp_path / "d", extra_args=["--parked-ttl", "2"], checkpoint_dir=tmp_path
    ) as d:
        with GuestSession(d.address, client="back in time") as s:
            p = s.mem_alloc(4096)
            s.memset_d8(p, 3, 4096)
            ckpt = tmp_path / "r.ckpt"
            with ControlClient(d.address, timeout=None) as c:
                c.checkpoint(s.session_id, str(ckpt), release=True)
                c.restore(str(ckpt))
            time.sleep(3.0)  # past the TTL: a restored session is live, not parked
            assert s.memcpy_dtoh(p, 4) == b"\x03" * 4
            assert _infos(d.address)[s.session_id].state == "running"
        assert "expired" not in d.log_text()


def test_moved_entry_redirects_until_its_ttl(tmp_path: Path) -> None:
    ttl = 3.0
    with (
        DaemonProcess(tmp_path / "src", extra_args=["--moved-ttl", str(ttl)]) as src,
        DaemonProcess(tmp_path / "dst") as dst,
        GuestSession(src.address, client="mover") as s,
    ):
        p = s.mem_alloc(1 << 16)
        s.memset_d8(p, 9, 1 << 16)
        s.synchronize()
        last = migrate(src.address, s.session_id, dst.address)[-1]
        assert last.phase == "done", last.error
        moved_at = time.monotonic()
        assert s.memcpy_dtoh(p, 4) == b"\x09" * 4  # the guest followed the redirect
        info = _infos(src.address)[s.session_id]  # still listed on the source
        assert info.state == "migrated"
        assert f"moved to {dst.address}" in info.location and "forgotten in" in info.location
        e = _resume(src.address, s.session_id, s._t.opened.resume_token)
        assert e.code() == grpc.StatusCode.NOT_FOUND
        assert dict(e.trailing_metadata())["crane-moved-to"] == dst.address
        time.sleep(max(ttl - (time.monotonic() - moved_at), 0) + 1.0)
        assert s.session_id not in _infos(src.address)
        e = _resume(src.address, s.session_id, s._t.opened.resume_token)
        assert e.code() == grpc.StatusCode.NOT_FOUND
        assert "crane-moved-to" not in dict(e.trailing_metadata() or ())
        assert f"session {s.session_id}: forgot its redirect to {dst.address}" in src.log_text()
        assert s.memcpy_dtoh(p, 4) == b"\x09" * 4  # unaffected on the destination
