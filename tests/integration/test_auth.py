"""Who may do what on craned (issue 13): unix callers identified by their uid through the ident
handshake, TCP callers by mutual TLS, sessions bound to the tenant that opened them, the control
API for operators, and migrations only between configured peers.

Clients of other uids run as child processes that drop to that uid before they connect
(``tests/integration/as_user.py``); the daemon runs as root, as it does in production."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from crane.cli.control_client import ControlClient
from crane.cli.migrate import migrate
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.wire.channel import TlsFiles
from tests.integration.as_user import probe as probe_here
from tests.integration.net import tcp_address
from tests.integration.pki import Pki

ROOT = Path(__file__).resolve().parents[2]
UID_A, UID_B = 4101, 4102  # no such users are needed: a uid is a number to the kernel

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="running clients as other uids needs root"
)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A run directory other users can reach (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="crane-auth-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def as_user(uid: int, address: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "CRANE_DAEMON": address, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.as_user", str(uid), *args],
        cwd="/",
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def probe(uid: int, address: str, *args: str) -> dict[str, list[str]]:
    p = as_user(uid, address, "probe", *args)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return json.loads(out)


class Opened:
    """A session a user's process holds open (its id and token, as that guest knows them)."""

    def __init__(self, uid: int, address: str) -> None:
        self.proc = as_user(uid, address, "open")
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            err = self.proc.stderr.read()  # type: ignore[union-attr]
            raise AssertionError(f"uid {uid} could not open a session: {err}")
        got = json.loads(line)
        self.id, self.token, self.path, self.ok = got["id"], got["token"], got["path"], got["ok"]

    def close(self) -> None:
        self.proc.communicate(timeout=60)


@needs_root
def test_unix_sessions_belong_to_their_users_uid(shared_dir: Path) -> None:
    """No tenants configured: each uid is its own tenant. User A's guest runs on the direct
    path (its worker's socket is A's). User B sees none of A's sessions, cannot resume A's
    session even with its token nor reach its worker's socket, and, being no operator, cannot
    checkpoint, restore or migrate; root (an operator) sees both tenants' sessions."""
    with DaemonProcess(shared_dir / "run", ["sim:h100-80gb"]) as d:
        os.chmod(d.run_dir, 0o755)
        a = Opened(UID_A, d.address)
        try:
            assert a.path == "ring" and a.ok  # the worker's sockets are A's: A reaches them
            direct = str(d.run_dir / "sessions" / f"{a.id}.sock")
            got = probe(UID_B, d.address, a.id, a.token, direct)
            assert got["direct"][0] == "PermissionError", got["direct"]
            assert got["ring"][0] == "PermissionError", got["ring"]
            assert got["devices"] == ["OK", "1"]
            assert got["ps"] == ["OK", "[]"]  # A's session is not B's to see
            assert got["resume"][0] == "PERMISSION_DENIED"
            assert f"session {a.id} belongs to another tenant" in got["resume"][1]
            assert f"uid {UID_B} (tenant uid:{UID_B})" in got["resume"][1]
            for op in ("checkpoint", "restore", "migrate"):
                assert got[op][0] == "PERMISSION_DENIED", (op, got[op])
                assert "needs the operator role" in got[op][1], got[op]
            assert got["open"][0] == "OK"  # B may open sessions of its own
            # the owner itself sees it (and still may not checkpoint: operators only)
            mine = probe(UID_A, d.address, a.id, a.token)
            assert mine["ps"] == ["OK", str([(a.id, f"uid:{UID_A}")])]
            assert mine["resume"] == ["OK", a.id]
            assert mine["checkpoint"][0] == "PERMISSION_DENIED"
            with ControlClient(d.address) as c:  # root operates the daemon
                (info,) = _once_settled(c)
            assert info.id == a.id and info.tenant == f"uid:{UID_A}"
        finally:
            a.close()
        log = d.log_text()
    assert f"Resume refused for unix:: session {a.id} belongs to another tenant" in log
    assert "Checkpoint refused for unix:: checkpoint of session" in log


@needs_root
def test_unlisted_uids_are_refused_when_tenants_are_configured(shared_dir: Path) -> None:
    """With ``[tenants.x] uids = [A]``, user A's sessions are tenant x's; user B, listed
    nowhere, is refused everything, by uid, so no one escapes the tenants' quotas."""
    cfg = shared_dir / "craned.toml"
    cfg.write_text(f"[tenants.x]\nuids = [{UID_A}]\n")
    with DaemonProcess(
        shared_dir / "run", ["sim:h100-80gb"], extra_args=["--config", str(cfg)]
    ) as d:
        os.chmod(d.run_dir, 0o755)
        a = Opened(UID_A, d.address)
        try:
            with ControlClient(d.address) as c:
                (info,) = c.sessions().sessions
            assert info.tenant == "x"
            got = probe(UID_B, d.address, a.id, a.token)
        finally:
            a.close()
    why = f"uid {UID_B} (gid {UID_B}) is in no tenant of this daemon"
    for op in ("devices", "ps", "resume", "checkpoint", "open"):
        assert got[op][0] in ("PERMISSION_DENIED", "ERROR"), (op, got[op])
        assert why in got[op][1], (op, got[op])


def test_a_unix_caller_without_a_credential_is_refused(daemon: DaemonProcess) -> None:
    """The ident handshake is not optional: a plain gRPC client is unauthenticated."""
    from crane.v1 import control_pb2, control_pb2_grpc
    from crane.wire.address import to_grpc_target

    with (
        grpc.insecure_channel(to_grpc_target(daemon.address)) as ch,
        pytest.raises(grpc.RpcError) as e,
    ):
        control_pb2_grpc.ControlStub(ch).ListSessions(control_pb2.ListSessionsRequest(), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "unix caller sent no credential" in (e.value.details() or "")


def _once_settled(c: ControlClient) -> list[Any]:
    """The daemon's sessions once those the probes opened and closed are gone (a close is
    asynchronous: the worker exits after the guest's stream ends); a session that stays fails
    the caller's assertion."""
    deadline = time.monotonic() + 10
    while True:
        sessions = list(c.sessions().sessions)
        if len(sessions) <= 1 or time.monotonic() > deadline:
            return sessions
        time.sleep(0.05)


# ---- TCP: mutual TLS ---------------------------------------------------------------------------
def _tls_daemon(tmp_path: Path, pki: Pki, name: str, *more: str, **kw: object) -> DaemonProcess:
    return DaemonProcess(
        tmp_path / name,
        ["sim:h100-80gb"],
        extra_listen=["tcp://127.0.0.1:0"],
        extra_args=[*pki.daemon_args(name), *more],
        **kw,  # type: ignore[arg-type]
    )


def _devices(address: str, tls: TlsFiles) -> list[str] | str:
    try:
        with ControlClient(address, timeout=10, tls=tls) as c:
            return [d.name for d in c.devices().devices]
    except grpc.RpcError as e:
        return f"{e.code().name}: {e.details()}"


def test_tcp_needs_a_client_certificate_its_ca_signed(tmp_path: Path, pki: Pki) -> None:
    """No certificate, a certificate of another CA, or plain TCP: refused at the handshake;
    a certificate of the daemon's CA: served. The CLI says which to give."""
    with _tls_daemon(tmp_path, pki, "craned-a") as d:
        tcp = tcp_address(d)
        alice = pki.issue("alice")
        assert _devices(tcp, alice) == ["NVIDIA H100 80GB HBM3"]
        assert _devices(tcp, TlsFiles(ca=alice.ca)).startswith("UNAVAILABLE")  # no certificate
        stranger = Pki(tmp_path / "other-ca").issue("alice")  # same name, another CA
        assert _devices(tcp, TlsFiles(stranger.cert, stranger.key, alice.ca)).startswith(
            "UNAVAILABLE"
        )
        assert _devices(tcp, TlsFiles()).startswith("UNAVAILABLE")  # plain TCP
        cli = [sys.executable, "-m", "crane.cli.main", "--daemon", tcp]
        out = subprocess.run([*cli, "ps"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and "--cert" in out.stderr, out.stderr
        mine = ["--cert", alice.cert, "--key", alice.key, "--ca", alice.ca]
        out = subprocess.run([*cli, *mine, "ps"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.startswith("SESSION"), out.stderr


def test_craned_refuses_plain_tcp_unless_told_it_is_for_development(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="needs mutual TLS"):
        DaemonProcess(tmp_path / "d", ["sim:l4"], extra_listen=["tcp://127.0.0.1:0"])


def test_a_cuda_program_runs_through_crane_run_over_mutual_tls(
    tmp_path: Path, pki: Pki, cuda_build: Callable[..., Path]
) -> None:
    """An unmodified CUDA program reaches the daemon over TCP with its certificate from
    $CRANE_TLS_*, the way a VM's or a remote host's guest does; without it, it gets no
    device."""
    source = (ROOT / "tests" / "interposer" / "programs" / "vadd.cu").read_text()
    exe = cuda_build(source, "-gencode", "arch=compute_80,code=compute_80", suffix=".exe")
    with _tls_daemon(tmp_path, pki, "craned-a") as d:
        tcp = tcp_address(d)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRANE_")}
        cmd = [sys.executable, "-m", "crane.cli.main", "run", "--daemon", tcp, "--", str(exe)]
        ok = subprocess.run(
            cmd, env={**env, **pki.issue("alice").env()}, capture_output=True, text=True
        )
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.strip() == "sync=cudaSuccess sum=1498500.0 c[999]=2997.0"
        bare = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert "sum=1498500.0" not in bare.stdout
        assert "cannot open a session" in bare.stderr + bare.stdout, bare.stderr
        assert "session " in d.log_text() and "cert CN=alice" in d.log_text()


TENANTS = """
[tenants.a]
certs = ["alice"]
[tenants.b]
certs = ["bob"]
[tenants.ops]
certs = ["ops"]
operator = true
"""


def test_tenants_by_certificate_are_kept_apart(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tenants a and b by client certificate on a TLS listener: b cannot see, checkpoint,
    restore or migrate a's session, nor resume it without its token or even with it; an
    operator's certificate sees and operates every tenant's; a certificate of no tenant is
    refused by name."""
    cfg = tmp_path / "craned.toml"
    cfg.write_text(TENANTS)
    with _tls_daemon(tmp_path, pki, "craned-a", "--config", str(cfg)) as d:
        tcp = tcp_address(d)

        def become(cn: str) -> None:
            for k, v in pki.issue(cn).env().items():
                monkeypatch.setenv(k, v)

        become("alice")
        with GuestSession(tcp, client="alice's") as s:
            p = s.mem_alloc(1 << 20)
            s.memset_d8(p, 5, 1 << 20)
            s.synchronize()
            token = s._t.opened.resume_token
            become("bob")
            bob = probe_here(tcp, s.session_id, token)
            become("ops")
            with ControlClient(tcp) as c:
                (info,) = _once_settled(c)
            ops_ckpt = ControlClient(tcp, timeout=60).checkpoint(s.session_id, "ops.ckpt", False)
            become("mallory")
            mallory = _devices(tcp, pki.issue("mallory"))
            become("alice")
            assert s.memcpy_dtoh(p, 4) == b"\x05" * 4  # alice's session is untouched
    assert bob["ps"] == ["OK", "[]"]
    for op in ("checkpoint", "restore", "migrate"):
        assert bob[op][0] == "PERMISSION_DENIED" and "needs the operator role" in bob[op][1]
        assert "cert CN=bob (tenant b)" in bob[op][1]
    assert bob["resume_without_token"][0] == "PERMISSION_DENIED"
    assert "wrong resume token" in bob["resume_without_token"][1]
    assert bob["resume"][0] == "PERMISSION_DENIED"
    assert "belongs to another tenant than cert CN=bob (tenant b)" in bob["resume"][1]
    assert bob["open"][0] == "OK" and bob["devices"] == ["OK", "1"]
    assert info.id == s.session_id and info.tenant == "a"
    assert ops_ckpt.memory_bytes >= 1 << 20
    assert mallory == "PERMISSION_DENIED: certificate CN=mallory is in no tenant of this daemon"


def test_migration_over_mutual_tls_only_between_peers(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """craned-a migrates a session to craned-b over TCP, presenting its own certificate; b
    lists a in ``peers`` and takes it, the guest follows with its own certificate and stays
    its tenant's. craned-c lists another peer and refuses a, naming it; the session carries on
    where it was."""
    cfg = tmp_path / "craned.toml"
    cfg.write_text('[tenants.t]\nuids = [0]\ncerts = ["guest"]\n')
    conf = ["--config", str(cfg)]
    with (
        _tls_daemon(tmp_path, pki, "craned-a", *conf) as a,
        _tls_daemon(tmp_path, pki, "craned-b", *conf, "--peer", "craned-a") as b,
        _tls_daemon(tmp_path, pki, "craned-c", *conf, "--peer", "craned-z") as c,
    ):
        for k, v in pki.issue("guest").env().items():
            monkeypatch.setenv(k, v)
        with GuestSession(a.address, client="moves") as s:  # root on a's unix socket: t
            p = s.mem_alloc(4 << 20)
            s.memset_d8(p, 9, 4 << 20)
            s.synchronize()
            refused = migrate(a.address, s.session_id, tcp_address(c))[-1]
            assert refused.phase == "failed"
            assert "refused this daemon" in refused.error, refused.error
            assert (
                "migrating a session here is for peer daemons; certificate CN=craned-a is in "
                "no tenant of this daemon nor one of its peers"
            ) in refused.error, refused.error
            assert s.memcpy_dtoh(p, 4) == b"\x09" * 4  # still on a
            done = migrate(a.address, s.session_id, tcp_address(b))[-1]
            assert done.phase == "done", done.error
            assert s.memcpy_dtoh(p + (4 << 20) - 4, 4) == b"\x09" * 4  # on b, over TCP
            assert s._t.address == tcp_address(b) and s._t.resumes == 1
            with ControlClient(b.address) as cb:
                (info,) = cb.sessions().sessions
            assert info.id == s.session_id and info.tenant == "t"
        assert "Preflight refused for ipv4:127.0.0.1" in c.log_text()
