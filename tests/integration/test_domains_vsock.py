"""The vsock path end to end, less the one hop this machine cannot make (no vhost-vsock, no
vsock loopback): a guest's ``vm://`` connection to ``crane vsock-bridge``'s loopback port, the
bridge's upstream (a socketpair where ``AF_VSOCK`` to CID 2 would be), the host side's
:func:`bridge_connection` resolving the peer's CID to its domain with libvirt (its test driver)
and splicing to that domain's socket on a real craned, which identifies the domain's guest."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from crane.api.errors import CudaError
from crane.cli.control_client import ControlClient
from crane.craned.launcher import DaemonProcess
from crane.daemon.vsock import CidResolver, bridge_connection
from crane.guest.session import GuestSession
from crane.wire.vsock_bridge import VsockBridge
from tests.unit.daemon.test_vsock import _node

libvirt = pytest.importorskip("libvirt")


@pytest.fixture
def vmd(tmp_path: Path) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path / "run", ["sim:h100-80gb"], extra_args=["--domain", "vm1"])
    try:
        yield d
    finally:
        d.stop()


def _bridge(node: str, cid: int, d: DaemonProcess) -> VsockBridge:
    """The guest's bridge, its vsock hop made of a socketpair whose host end is bridged by the
    daemon side's code as its vsock listener would, with the peer CID ``cid``."""
    resolver = CidResolver(node)

    def socket_of(domain: str) -> Path | None:
        path = d.run_dir / "domains" / f"{domain}.sock"
        return path if path.exists() else None

    def dial() -> socket.socket:
        guest_end, host_end = socket.socketpair()
        threading.Thread(
            target=bridge_connection,
            args=(host_end, cid, resolver.domain_of, socket_of),
            daemon=True,
        ).start()
        return guest_end

    return VsockBridge(0, ("127.0.0.1", 0), dial=dial).start()


def test_a_vsock_guest_is_its_cids_domain(vmd: DaemonProcess, tmp_path: Path) -> None:
    node = _node(tmp_path / "node.xml", vm1=3, vm2=4)
    bridge = _bridge(node, 3, vmd)
    s = GuestSession(f"vm://127.0.0.1:{bridge.address[1]}")
    try:
        d = s.mem_alloc(1024)
        s.memcpy_htod(d, b"over vsock")
        assert s.memcpy_dtoh(d, 10) == b"over vsock"
        with ControlClient(vmd.address) as c:
            (info,) = c.sessions("vm1").sessions
        assert (info.id, info.tenant) == (s.session_id, "domain:vm1")
    finally:
        s.close()
        bridge.close()


def test_an_unknown_or_unattached_cid_is_refused(vmd: DaemonProcess, tmp_path: Path) -> None:
    node = _node(tmp_path / "node.xml", vm1=3, vm2=4)
    for cid in (9, 4):  # no domain has CID 9; vm2 (CID 4) is not attached to this daemon
        bridge = _bridge(node, cid, vmd)
        try:
            with pytest.raises(CudaError):
                GuestSession(f"vm://127.0.0.1:{bridge.address[1]}")
        finally:
            bridge.close()
    with ControlClient(vmd.address) as c:
        assert not c.sessions().sessions


def test_craned_serves_its_vsock_port(tmp_path: Path) -> None:
    """The listener binds (AF_VSOCK exists here; connecting needs vhost-vsock or loopback)."""
    probe = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    try:
        probe.bind((socket.VMADDR_CID_ANY, socket.VMADDR_PORT_ANY))
        port = probe.getsockname()[1]
    except OSError as e:
        pytest.skip(f"AF_VSOCK unavailable here: {e}")
    finally:
        probe.close()
    args = ["--vsock-port", str(port), "--vsock-libvirt-uri", "test:///default"]
    with DaemonProcess(tmp_path / "run", ["sim:h100-80gb"], extra_args=args) as d:
        deadline = time.monotonic() + 10
        while f"vsock port {port}: bridged to the domain sockets" not in d.log_text():
            assert time.monotonic() < deadline, d.log_text()
            time.sleep(0.05)
