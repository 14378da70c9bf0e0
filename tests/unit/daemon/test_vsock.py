"""A vsock peer's CID resolved to its libvirt domain (crane/daemon/vsock.py), against libvirt's
test driver reading a node file: per connection, never cached (a VM's CID may change when it
migrates)."""

from __future__ import annotations

import logging
import socket
import threading
from pathlib import Path

import pytest

from crane.daemon.vsock import CidResolver, bridge_connection, vsock_cids

DOMAIN = """<domain type='test'><name>{name}</name><memory>65536</memory><os><type>hvm</type>
  </os><devices><vsock model='virtio'><cid auto='no' address='{cid}'/></vsock></devices>
</domain>"""


def _node(path: Path, **cids: int) -> str:
    path.write_text(
        "<node>" + "".join(DOMAIN.format(name=n, cid=c) for n, c in cids.items()) + "</node>"
    )
    return f"test://{path}"


def test_cids_of_a_domain_xml() -> None:
    xml = DOMAIN.format(name="vm1", cid=42)
    assert vsock_cids(xml) == [42]
    assert vsock_cids("<domain><devices><vsock><cid auto='yes'/></vsock></devices></domain>") == []
    assert vsock_cids("<domain><devices/></domain>") == []


def test_resolution_per_connection(tmp_path: Path) -> None:
    pytest.importorskip("libvirt")
    node = tmp_path / "node.xml"
    resolver = CidResolver(_node(node, vm1=3, vm2=4))
    assert resolver.domain_of(3) == "vm1" and resolver.domain_of(4) == "vm2"
    with pytest.raises(LookupError, match=r"no running domain .* CID 9"):
        resolver.domain_of(9)
    _node(node, vm1=7, vm2=4)  # vm1 migrated and came back with another CID
    assert resolver.domain_of(7) == "vm1"
    with pytest.raises(LookupError):
        resolver.domain_of(3)
    _node(node, vm1=5, vm2=5)
    with pytest.raises(LookupError, match="several"):
        resolver.domain_of(5)
    with pytest.raises(LookupError, match="cannot reach libvirt"):
        CidResolver(f"test://{tmp_path / 'missing.xml'}").domain_of(3)


def test_refused_connections_are_closed_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("libvirt")
    resolver = CidResolver(_node(tmp_path / "node.xml", vm1=3))
    for cid, attached, why in (
        (9, {"vm1"}, "no running domain"),
        (3, set(), "not attached"),
    ):
        ours, theirs = socket.socketpair()

        def socket_of(d: str, attached: set[str] = attached) -> Path | None:
            return tmp_path / f"{d}.sock" if d in attached else None

        with caplog.at_level(logging.WARNING, logger="craned"):
            done = threading.Thread(
                target=bridge_connection, args=(theirs, cid, resolver.domain_of, socket_of)
            )
            done.start()
            done.join(10)
        ours.settimeout(5)
        assert ours.recv(1) == b""  # closed
        assert f"CID {cid}" in caplog.text and why in caplog.text
        ours.close()
