"""Who may do what on craned (issue 13): unix callers identified by their uid through the ident
handshake, TCP callers by mutual TLS, sessions bound to the tenant that opened them, the control
API for operators, and migrations only between configured peers.

Clients of other uids run as child processes that drop to that uid before they connect
(``tests/integration/as_user.py``); the daemon runs as root, as it does in production."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from crane.cli.control_client import ControlClient
from crane.craned.launcher import DaemonProcess

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
        subprocess.run(["rm", "-rf", str(d)], check=False)


def as_user(uid: int, address: str, *args: str, **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ, "CRANE_DAEMON": address, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.as_user", str(uid), *args],
        cwd="/",
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,  # type: ignore[call-overload]
    )


def probe(uid: int, address: str, sid: str, token: str) -> dict[str, list[str]]:
    p = as_user(uid, address, "probe", sid, token)
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
        self.id, self.token = got["id"], got["token"]

    def close(self) -> None:
        self.proc.communicate(timeout=60)


@needs_root
def test_unix_sessions_belong_to_their_users_uid(shared_dir: Path) -> None:
    """No tenants configured: each uid is its own tenant. User B sees none of user A's
    sessions, cannot resume A's session even with its token, and, being no operator, cannot
    checkpoint, restore or migrate; root (an operator) sees both tenants' sessions."""
    with DaemonProcess(shared_dir / "run", ["sim:h100-80gb"]) as d:
        os.chmod(d.run_dir, 0o755)
        a = Opened(UID_A, d.address)
        try:
            got = probe(UID_B, d.address, a.id, a.token)
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
                (info,) = c.sessions().sessions
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
    import grpc

    from crane.v1 import control_pb2, control_pb2_grpc
    from crane.wire.address import to_grpc_target

    with (
        grpc.insecure_channel(to_grpc_target(daemon.address)) as ch,
        pytest.raises(grpc.RpcError) as e,
    ):
        control_pb2_grpc.ControlStub(ch).ListSessions(control_pb2.ListSessionsRequest(), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "unix caller sent no credential" in (e.value.details() or "")
