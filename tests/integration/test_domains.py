"""VM guests identified by the host (crane/daemon/domains.py): a socket per libvirt domain.

Each test reaches a domain socket as a VM's guest does: through a socat forward from a
``vm://`` TCP address (QEMU's ``guestfwd`` runs the same socat), with no ident handshake.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from crane.api.errors import CudaError
from crane.cli.control_client import ControlClient
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.v1 import guest_pb2, guest_pb2_grpc
from crane.wire.channel import open_channel
from crane.wire.fingerprint import fingerprint
from tests.integration.vmfwd import Forward


@pytest.fixture
def vmd(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A daemon with domain ``vm1`` configured at start (tenant ``alice``)."""
    d = DaemonProcess(
        tmp_path / "run",
        ["sim:h100-80gb"],
        extra_args=["--domain", "vm1=alice"],
        checkpoint_dir=tmp_path,
    )
    try:
        yield d
    finally:
        d.stop()


def _sock(d: DaemonProcess, domain: str) -> Path:
    return d.run_dir / "domains" / f"{domain}.sock"


def _ps(d: DaemonProcess, *args: str) -> str:
    cmd = [sys.executable, "-m", "crane.cli.main", "ps", "--daemon", d.address, *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_domain_sockets_identify_their_vm(vmd: DaemonProcess) -> None:
    vm1 = _sock(vmd, "vm1")
    assert stat.S_IMODE(vm1.stat().st_mode) == 0o660
    with ControlClient(vmd.address) as c:
        got = c.attach_domain("vm2")
        assert (got.path, got.tenant, got.already) == (str(_sock(vmd, "vm2")), "domain:vm2", False)
        again = c.attach_domain("vm2")  # idempotent
        assert again.already and again.path == got.path
        with pytest.raises(grpc.RpcError) as e:
            c.attach_domain("vm2", tenant="bob")  # another tenant than its sessions'
        assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
        for bad in ("../etc", "a/b", "-x", "x" * 65, ""):
            with pytest.raises(grpc.RpcError) as e:
                c.attach_domain(bad)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
    f1, f2 = Forward(vm1), Forward(_sock(vmd, "vm2"))
    s1 = GuestSession(f1.address, client="vm1-guest")
    s2 = GuestSession(f2.address, client="vm2-guest")
    local = GuestSession(vmd.address, client="host")
    try:
        assert s1._t.path == "relay"  # a VM's guest cannot reach the worker's socket
        d = s1.mem_alloc(1 << 20)
        s1.memcpy_htod(d, b"\x07" * 16)
        assert s1.memcpy_dtoh(d, 16) == b"\x07" * 16
        with ControlClient(vmd.address) as c:
            rows = {s.id: s for s in c.sessions().sessions}
            assert (rows[s1.session_id].domain, rows[s1.session_id].tenant) == ("vm1", "alice")
            assert (rows[s2.session_id].domain, rows[s2.session_id].tenant) == ("vm2", "domain:vm2")
            assert rows[local.session_id].domain == ""
            only = c.sessions("vm1").sessions
            assert [s.id for s in only] == [s1.session_id]
        out = _ps(vmd, "--domain", "vm1")
        assert "DOMAIN" in out.splitlines()[0] and s1.session_id in out
        assert s2.session_id not in out and local.session_id not in out
        # a guest sees only its own domain's sessions, and is never an operator
        with ControlClient(f2.address) as gc:
            assert [s.id for s in gc.sessions().sessions] == [s2.session_id]
            with pytest.raises(grpc.RpcError) as e:
                gc.attach_domain("vm3")
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        for s in (s1, s2, local):
            s.close()
        f1.close()
        f2.close()


def _resume(address: str, sid: str, token: bytes) -> grpc.RpcError | None:
    with open_channel(address) as ch:
        stub = guest_pb2_grpc.GuestStub(ch)
        req = guest_pb2.ResumeRequest(session_id=sid, resume_token=token, fingerprint=fingerprint())
        try:
            stub.Resume(req, timeout=10)
        except grpc.RpcError as e:
            return e
    return None


def test_a_guest_claiming_another_domains_session_is_refused(vmd: DaemonProcess) -> None:
    """vm2's guest presents vm1's session id and its valid resume token: refused, naming both
    domains, and logged; a host process (no domain) and vm1 itself fare as they should."""
    with ControlClient(vmd.address) as c:
        c.attach_domain("vm2", tenant="alice")  # the same tenant: only the domain differs
    f1, f2 = Forward(_sock(vmd, "vm1")), Forward(_sock(vmd, "vm2"))
    s1 = GuestSession(f1.address)
    host = GuestSession(vmd.address)
    try:
        sid, token = s1.session_id, s1._t.opened.resume_token
        e = _resume(f2.address, sid, token)
        assert e is not None and e.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "domain vm1" in e.details() and "domain vm2" in e.details()
        assert "domain vm1" in vmd.log_text().split("Resume refused")[-1]
        # a VM's guest cannot take a host process's session either
        e = _resume(f1.address, host.session_id, host._t.opened.resume_token)
        assert e is not None and e.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "no domain" in e.details()
        assert _resume(f1.address, sid, token) is None  # its own domain: fine
        # metadata claiming an identity is not read on a domain socket
        assert s1.memcpy_dtoh(s1.mem_alloc(64), 8) == b"\0" * 8
    finally:
        s1.close()
        host.close()
        f1.close()
        f2.close()


def test_detach_keeps_sessions_and_checkpoints_keep_the_domain(
    vmd: DaemonProcess, tmp_path: Path
) -> None:
    f1 = Forward(_sock(vmd, "vm1"))
    s = GuestSession(f1.address)
    try:
        d = s.mem_alloc(4096)
        s.memcpy_htod(d, b"abcd")
        with ControlClient(vmd.address) as c:
            got = c.detach_domain("vm1")
            assert got.detached and not Path(got.path).exists()
            assert not c.detach_domain("vm1").detached
            assert s.memcpy_dtoh(d, 4) == b"abcd"  # its open connection carries on
            with pytest.raises(CudaError):
                GuestSession(f1.address)  # no new connection reaches the domain any more
            c.checkpoint(s.session_id, "s.ckpt", release=True)
            c.attach_domain("vm1")
            c.restore("s.ckpt")
            (info,) = [x for x in c.sessions().sessions if x.id == s.session_id]
            assert (info.domain, info.tenant, info.state) == ("vm1", "alice", "ready")
        assert s.memcpy_dtoh(d, 4) == b"abcd"  # resumed on the re-attached socket
    finally:
        s.close()
        f1.close()


def test_bad_domain_configuration_is_refused_at_start(tmp_path: Path) -> None:
    cfg = tmp_path / "craned.toml"
    cfg.write_text('[domains."a/b"]\n')
    cmd = [sys.executable, "-m", "crane.craned.main", "--config", str(cfg), "--backend", "sim"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "a/b" in p.stderr and "not accepted" in p.stderr
    cfg.write_text('domain_socket_group = "no-such-group-here"\n')
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no-such-group-here" in p.stderr
    assert os.path.exists(cfg)
