"""Integration fixtures: a real craned (own process, own workers) on a temp-dir unix socket.

``session`` runs each test twice: with the call stream carried straight to the session's worker
(how guests on the daemon's host connect) and through the daemon's relay (how a VM behind one
forwarded port, or a remote guest, connects).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from tests.integration.pki import Pki
from tests.integration.workload import SRC


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path / "run", ["sim:h100-80gb"], checkpoint_dir=tmp_path)
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A CA for this test, issuing daemons' and clients' certificates."""
    return Pki(tmp_path / "pki")


@pytest.fixture
def daemons(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    """Two daemons of different models (H100, A100), each also listening on a TCP port (see
    ``tests.integration.net.tcp_address``) with mutual TLS, each the other's peer, for
    checkpoints, migrations and their faults. This process's clients reach them over TCP with
    the certificate of a guest ($CRANE_TLS_*, tenant ``cert:guest``). Both keep checkpoints in
    ``tmp_path`` (a file one writes, the other restores)."""
    tcp = ["tcp://127.0.0.1:0"]
    args_a = pki.daemon_args("craned-a", peers=["craned-b"])
    args_b = pki.daemon_args("craned-b", peers=["craned-a"])
    a = DaemonProcess(
        tmp_path / "a",
        ["sim:h100-80gb"],
        extra_listen=tcp,
        extra_args=args_a,
        checkpoint_dir=tmp_path,
    )
    try:
        b = DaemonProcess(
            tmp_path / "b",
            ["sim:a100-80gb"],
            extra_listen=tcp,
            extra_args=args_b,
            checkpoint_dir=tmp_path,
        )
    except BaseException:
        a.stop()
        raise
    for k, v in pki.issue("guest").env().items():
        monkeypatch.setenv(k, v)
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest.fixture(params=["ring", "direct", "relay"])
def session(
    daemon: DaemonProcess, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[GuestSession]:
    """A session on each path a guest may take: the worker's call ring, its gRPC socket
    (``direct``) and the daemon's relay; every test using it runs on all three."""
    monkeypatch.setenv("CRANE_RING", "require" if request.param == "ring" else "0")
    s = GuestSession(daemon.address, client="pytest", direct=request.param != "relay")
    assert s._t.path == request.param
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def in_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Daemons started after this fixture migrate memory inside the Transfer stream, not on the
    data plane (``CRANE_MIGRATE_STREAMS=0``, inherited by their workers): for tests that cut or
    stall that stream by its byte count (a proxy between the daemons sees only the stream)."""
    monkeypatch.setenv("CRANE_MIGRATE_STREAMS", "0")


@pytest.fixture
def copy_on_one_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Daemons started after this fixture copy a migration's memory on the data plane even
    between daemons of one host, which otherwise hand it over (``CRANE_MIGRATE_HANDOVER=0``,
    inherited by their workers): for tests about the copy itself."""
    monkeypatch.setenv("CRANE_MIGRATE_HANDOVER", "0")


@pytest.fixture
def image(cuda_build) -> bytes:  # type: ignore[no-untyped-def]
    # PTX for compute_80: runs on the A100 (sm_80) and, JIT-compiled, on the H100 (sm_90)
    return cuda_build(
        SRC, "-fatbin", "-gencode", "arch=compute_80,code=compute_80", suffix=".fatbin"
    ).read_bytes()


@pytest.fixture
def image_sm90_only(cuda_build) -> bytes:  # type: ignore[no-untyped-def]
    return cuda_build(
        SRC, "-fatbin", "-gencode", "arch=compute_90,code=compute_90", suffix=".fatbin"
    ).read_bytes()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory other users can reach (pytest's tmp_path is root's alone), for daemons
    whose guests run as other uids."""
    d = Path(tempfile.mkdtemp(prefix="crane-shared-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


#: The transports a guest on the daemon's host may use, and what CRANE_RING says for each.
TRANSPORTS = {"ring": "require", "direct": "0"}


@pytest.fixture(params=sorted(TRANSPORTS))
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A test that takes it runs once per same-host transport: the shared-memory call ring
    (a refusal is an error) and the worker's gRPC socket."""
    monkeypatch.setenv("CRANE_RING", TRANSPORTS[request.param])
    return request.param
