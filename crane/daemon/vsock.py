"""The host side of the vsock path: an ``AF_VSOCK`` listener that bridges each VM's connection
to its libvirt domain's socket (:mod:`crane.daemon.domains`).

gRPC's wheel cannot serve ``vsock:``, so craned (``vsock_port``) accepts vsock connections
itself and splices each to ``<run_dir>/domains/<domain>.sock``, where the domain socket's
server identifies the caller as that domain's guest. Which domain: the connection's peer CID,
resolved *at connect time* against libvirt's running domains (``<devices><vsock><cid
address=.../>``). A CID belongs to a running VM, and a VM may get another CID after a migration
(the guest's kernel re-reads it on the transport-reset event), so nothing is cached across
connections: each new connection asks libvirt again. A CID no running domain has, one that
several have, a domain not attached here, or libvirt unreachable: the connection is closed and
one log line says why. The guest side is :mod:`crane.wire.vsock_bridge`.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from crane.wire.splice import splice

__all__ = ["CidResolver", "VsockListener", "bridge_connection", "vsock_cids"]

log = logging.getLogger("craned")

_CONNECT_TIMEOUT_S = 5.0


def vsock_cids(domain_xml: str) -> list[int]:
    """The guest CIDs a domain's (live) XML gives its vsock devices."""
    out = []
    for cid in ET.fromstring(domain_xml).findall("./devices/vsock/cid"):
        address = cid.get("address")
        if address is not None and address.isdigit():
            out.append(int(address))
    return out


class CidResolver:
    """Which running libvirt domain has a CID, asked of libvirt at ``uri`` each time."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def domain_of(self, cid: int) -> str:
        """The name of the running domain whose vsock has ``cid``; ``LookupError`` says why
        there is none (no such domain, several, libvirt unreachable)."""
        try:
            import libvirt
        except ImportError:
            raise LookupError("libvirt-python is not installed (pip install crane[vm])") from None
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)  # errors raise, not print
        try:
            conn = libvirt.openReadOnly(self.uri)
        except libvirt.libvirtError as e:
            raise LookupError(f"cannot reach libvirt at {self.uri}: {e}") from None
        try:
            names = []
            for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
                try:
                    if cid in vsock_cids(dom.XMLDesc(0)):
                        names.append(dom.name())
                except libvirt.libvirtError:
                    continue  # it stopped while we looked
        finally:
            conn.close()
        if not names:
            raise LookupError(f"no running domain of {self.uri} has vsock CID {cid}")
        if len(names) > 1:
            raise LookupError(f"several running domains have vsock CID {cid}: {sorted(names)}")
        return names[0]


def bridge_connection(
    conn: socket.socket,
    cid: int,
    resolve: Callable[[int], str],
    socket_of: Callable[[str], Path | None],
) -> str | None:
    """Splice ``conn`` (from vsock CID ``cid``) to its domain's socket until either side ends;
    the domain, or None when ``conn`` was refused (closed, one log line saying why).
    ``socket_of(domain)``: the domain's socket path, None when it is not attached here."""
    try:
        domain = resolve(cid)
    except LookupError as e:
        log.warning("vsock: connection from CID %d refused: %s", cid, e)
        conn.close()
        return None
    path = socket_of(domain)
    if path is None:
        log.warning("vsock: connection from CID %d (domain %s) refused: not attached", cid, domain)
        conn.close()
        return None
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.settimeout(_CONNECT_TIMEOUT_S)
        up.connect(str(path))
        up.settimeout(None)
    except OSError as e:
        log.warning("vsock: CID %d (domain %s): cannot reach %s: %s", cid, domain, path, e)
        up.close()
        conn.close()
        return None
    log.debug("vsock: CID %d is domain %s", cid, domain)
    splice(conn, up)
    return domain


class VsockListener:
    """Accepts ``AF_VSOCK`` connections on ``port`` (any CID) and bridges each on a thread of
    its own (:func:`bridge_connection`)."""

    def __init__(
        self,
        port: int,
        resolve: Callable[[int], str],
        socket_of: Callable[[str], Path | None],
    ) -> None:
        family = getattr(socket, "AF_VSOCK", None)
        if family is None:
            raise OSError("this Python has no AF_VSOCK (Linux only)")
        self.resolve = resolve
        self.socket_of = socket_of
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.bind((socket.VMADDR_CID_ANY, port))
            self._sock.listen(64)
        except OSError:
            self._sock.close()
            raise
        self.port = port
        self._stopped = threading.Event()
        threading.Thread(target=self._serve, name="vsock", daemon=True).start()

    def _serve(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, (cid, _port) = self._sock.accept()
            except OSError as e:
                if self._stopped.is_set():
                    return
                log.warning("vsock: accept failed: %s", e)
                self._stopped.wait(0.05)  # e.g. out of descriptors: do not spin
                continue
            threading.Thread(
                target=bridge_connection,
                args=(conn, cid, self.resolve, self.socket_of),
                name=f"vsock-{cid}",
                daemon=True,
            ).start()

    def close(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
