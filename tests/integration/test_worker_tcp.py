"""Remote guests on their worker's own TCP endpoint (``worker_tcp_ports``): the relay's hop
removed for guests that reach the daemon over TCP with mutual TLS, with the daemon's identity
and tenancy rules enforced at the worker (docs/design.md, Invariant 4)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from crane.cli.control_client import ControlClient
from crane.cli.migrate import migrate
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.interposer import library_path
from crane.v1 import guest_pb2
from crane.wire.channel import open_channel
from tests.integration.net import CutProxy
from tests.integration.pki import Pki
from tests.integration.test_domains_tls import domain_cert

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tests" / "interposer" / "programs"
TENANTS = '[tenants.t]\ncerts = ["guest"]\n[tenants.u]\ncerts = ["other"]\n'
ATTACHED_TCP = "guest attached directly (ipv4:"


def _free_range(n: int = 4) -> str:
    """``n`` consecutive ports nothing listens on now (the system's choice, then its next)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        if first + n >= 65536:
            continue
        ok = True
        for p in range(first, first + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return f"{first}-{first + n - 1}"
    raise RuntimeError("no free port range")


@pytest.fixture
def tenants(tmp_path: Path) -> Path:
    cfg = tmp_path / "tenants.toml"
    cfg.write_text(TENANTS)
    return cfg


def _daemon(
    tmp_path: Path, pki: Pki, name: str, tenants: Path, *more: str, host: str = "127.0.0.1"
) -> DaemonProcess:
    return DaemonProcess(
        tmp_path / name,
        ["sim:h100-80gb"],
        checkpoint_dir=tmp_path,
        extra_listen=[f"tcp://{host}:0"],
        extra_args=[
            *pki.daemon_args(name),
            "--config",
            str(tenants),
            "--worker-tcp-ports",
            _free_range(),
            *more,
        ],
    )


def test_remote_guest_runs_a_program_on_its_workers_endpoint(
    tmp_path: Path, pki: Pki, tenants: Path, cuda_build: Callable[..., Path]
) -> None:
    """An nvcc-built program under ``crane run`` against a tcp:// daemon with mutual TLS: its
    calls go to its worker's own TCP endpoint (the worker logs the attach from an ipv4 peer;
    the daemon never attached a relay stream) and its output is right."""
    if not library_path().exists():
        pytest.skip("guest library not built (scripts/setup.sh)")
    exe = cuda_build(
        (PROGRAMS / "vadd.cu").read_text(),
        f"-I{PROGRAMS}",
        "-gencode",
        "arch=compute_80,code=compute_80",
        suffix=".exe",
    )
    with _daemon(tmp_path, pki, "craned-a", tenants) as d:
        env = {**os.environ, **pki.issue("guest").env()}
        env.pop("CRANE_TRACE", None)
        cmd = [sys.executable, "-m", "crane.cli.main", "run", "--daemon", d.tcp_address(), "--"]
        p = subprocess.run(
            [*cmd, str(exe)], env=env, capture_output=True, text=True, timeout=180, cwd=ROOT
        )
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == "sync=cudaSuccess sum=1498500.0 c[999]=2997.0"
        log = d.log_text()
        assert ATTACHED_TCP in log, log
        assert "serving the session's remote guest on tcp 127.0.0.1:" in log


def _raw_calls(target: str, files: object, sid: str, token: bytes) -> grpc.RpcError:
    """Open a call stream to a worker endpoint as a guest would; the error it ends with."""
    ch = open_channel(target, files)  # type: ignore[arg-type]
    try:
        stream = ch.stream_stream("/crane.v1.Guest/Calls")(
            iter([guest_pb2.CallBatch().SerializeToString()]),
            metadata=(("crane-session", sid), ("crane-token-bin", token)),
            timeout=20,
        )
        with pytest.raises(grpc.RpcError) as e:
            list(stream)
        return e.value  # type: ignore[return-value]
    finally:
        ch.close()


def test_another_tenants_certificate_is_refused_at_the_worker(
    tmp_path: Path, pki: Pki, tenants: Path
) -> None:
    """A guest of tenant u holding t's session id and resume token is refused at t's worker
    endpoint, with the daemon's reason, and the worker logs the refusal; so is a peer daemon's
    certificate. The session's own guest carries on there."""
    with _daemon(tmp_path, pki, "craned-a", tenants) as d:
        with GuestSession(d.tcp_address(), client="victim", tls=pki.issue("guest")) as s:
            assert s._t.path == "direct"
            p = s.mem_alloc(1024)
            s.memset_d8(p, 5, 1024)
            s.synchronize()
            port = s._t.opened.direct_address.rsplit(":", 1)[1]
            target = f"tcp://127.0.0.1:{port}"
            sid, token = s.session_id, s._t.opened.resume_token
            err = _raw_calls(target, pki.issue("other"), sid, token)
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED, err
            assert f"session {sid} belongs to another tenant than cert CN=other" in err.details()
            err = _raw_calls(target, pki.issue("craned-z"), sid, token)
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED, err
            assert "certificate CN=craned-z is in no tenant" in err.details()
            vm = domain_cert(pki, "vm-guest", "urn:crane:domain:vm1")
            err = _raw_calls(target, vm, sid, token)
            assert err.code() == grpc.StatusCode.PERMISSION_DENIED, err
            assert "belongs to no domain (a host process's)" in err.details()
            assert s.memcpy_dtoh(p, 4) == b"\x05" * 4  # the rightful guest is untouched
        log = d.log_text()
        assert "refused a guest at this worker's endpoint (ipv4:127.0.0.1:" in log
        assert "belongs to another tenant than cert CN=other" in log


def test_a_vms_session_keeps_the_relay(tmp_path: Path, pki: Pki, tenants: Path) -> None:
    """A VM's guest reaching craned over TCP with its domain's certificate is offered no
    worker endpoint (its session must outlive connection resets while the VM moves, which
    only the relay tells apart) and works through the relay."""
    vm = domain_cert(pki, "vm-guest", "urn:crane:domain:vm1")
    with (
        _daemon(tmp_path, pki, "craned-a", tenants) as d,
        GuestSession(d.tcp_address(), client="vm", tls=vm) as s,
    ):
        assert not s._t.opened.direct_address.startswith("tcp://")
        assert s._t.path == "relay"
        p = s.mem_alloc(1024)
        s.memset_d8(p, 4, 1024)
        assert s.memcpy_dtoh(p, 4) == b"\x04" * 4
        assert "serving the session's remote guest on tcp" not in d.log_text()


def test_unreachable_worker_endpoint_falls_back_to_the_relay(
    tmp_path: Path, pki: Pki, tenants: Path
) -> None:
    """A guest that reaches the daemon through a forward of its one port (here a TCP proxy on
    127.0.0.1 to a daemon on 127.0.0.2) cannot reach the worker's port there: it carries its
    calls through the daemon's relay and works."""
    with (
        _daemon(tmp_path, pki, "craned-a", tenants, host="127.0.0.2") as d,
        CutProxy(d.tcp_address()) as proxy,
        GuestSession(proxy.address, client="forwarded", tls=pki.issue("guest")) as s,
    ):
        assert s._t.opened.direct_address.startswith("tcp://*:")
        assert s._t.path == "relay"
        p = s.mem_alloc(1024)
        s.memset_d8(p, 3, 1024)
        assert s.memcpy_dtoh(p, 4) == b"\x03" * 4
        assert ATTACHED_TCP not in d.log_text()


@contextlib.contextmanager
def _peers(tmp_path: Path, pki: Pki, tenants: Path) -> Iterator[tuple[DaemonProcess, ...]]:
    with (
        _daemon(tmp_path, pki, "craned-a", tenants) as a,
        _daemon(tmp_path, pki, "craned-b", tenants, "--peer", "craned-a") as b,
    ):
        yield a, b


def test_migrated_remote_session_follows_to_the_new_workers_endpoint(
    tmp_path: Path, pki: Pki, tenants: Path
) -> None:
    """A remote guest on its worker's endpoint on craned-a; the session migrates to craned-b
    (over mutual TLS between peers); the guest resumes on b and attaches to b's worker's own
    endpoint, its memory intact, and a's worker port is free again."""
    with _peers(tmp_path, pki, tenants) as (a, b):
        with GuestSession(a.tcp_address(), client="moves", tls=pki.issue("guest")) as s:
            assert s._t.path == "direct"
            before = s._t.opened.direct_address
            p = s.mem_alloc(1 << 20)
            s.memset_d8(p, 9, 1 << 20)
            s.synchronize()
            done = migrate(a.address, s.session_id, b.tcp_address())[-1]
            assert done.phase == "done", done.error
            assert s.memcpy_dtoh(p + (1 << 20) - 4, 4) == b"\x09" * 4
            assert s._t.address == b.tcp_address() and s._t.resumes == 1
            assert s._t.path == "direct"
            assert s._t.opened.direct_address != before
        assert ATTACHED_TCP in b.log_text()


def test_parked_and_restored_remote_session_comes_back_on_its_new_workers_endpoint(
    tmp_path: Path, pki: Pki, tenants: Path
) -> None:
    """A remote guest's session is parked to a file and restored on the same daemon: its
    next call resumes it, on the new worker's own endpoint, its memory intact."""
    with (
        _daemon(tmp_path, pki, "craned-a", tenants) as d,
        GuestSession(d.tcp_address(), client="parked", tls=pki.issue("guest")) as s,
    ):
        assert s._t.path == "direct"
        p = s.mem_alloc(1 << 20)
        s.memset_d8(p, 6, 1 << 20)
        s.synchronize()
        ckpt = tmp_path / "p.ckpt"
        with ControlClient(d.address, timeout=None) as c:
            assert c.checkpoint(s.session_id, str(ckpt), release=True).state == "parked"
            c.restore(str(ckpt))
        assert s.memcpy_dtoh(p + 4096, 4) == b"\x06" * 4
        assert s._t.resumes == 1 and s._t.path == "direct"
        assert s._t.opened.direct_address.startswith("tcp://*:")
        assert d.log_text().count(ATTACHED_TCP) == 2
