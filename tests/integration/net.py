"""Network helpers for migration tests: a daemon's TCP address, and a cutting proxy.

:class:`CutProxy` is a TCP forwarding proxy that can pause or cut a connection at a byte count.
Put between two daemons (the source is told to migrate to the proxy's ``address``), it forwards
bytes both ways and counts those going upstream (client to server). At ``hold_at`` upstream
bytes it stops forwarding until :meth:`release`; at ``cut_at`` it forwards exactly up to that
byte and then cuts: both sides of every connection and its listener are closed, like a network
partition (a reconnect is refused). Thresholds are byte counts, never timings, so where a cut
lands in a transfer is deterministic.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

from crane.craned.launcher import DaemonProcess

__all__ = ["CutProxy", "tcp_address"]


def tcp_address(d: DaemonProcess) -> str:
    """The TCP address a daemon started with ``extra_listen=["tcp://127.0.0.1:0"]`` bound."""
    return d.tcp_address()


class CutProxy:
    def __init__(
        self, upstream: str, cut_at: int | None = None, hold_at: int | None = None
    ) -> None:
        """``upstream``: a daemon address, ``unix:///path.sock`` or ``tcp://host:port``."""
        self.upstream = upstream
        self.cut_at = cut_at
        self.hold_at = hold_at
        self.sent_up = 0
        self.holding = threading.Event()  # forwarding is paused at hold_at
        self.cut = threading.Event()  # the connection was cut
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def release(self) -> None:
        """Forward again after a hold."""
        self._released.set()

    def close(self) -> None:
        """Cut everything now (also the end of a test's use of the proxy)."""
        with self._lock:
            self.cut.set()
            socks, self._socks = [self._listener, *self._socks], []
        self._released.set()
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def __enter__(self) -> CutProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self) -> socket.socket:
        if self.upstream.startswith("unix://"):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(Path(self.upstream[len("unix://") :])))
            return s
        host, port = self.upstream.removeprefix("tcp://").rsplit(":", 1)
        return socket.create_connection((host, int(port)))

    def _accept(self) -> None:
        while not self.cut.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = self._connect()
            except OSError:
                client.close()
                continue
            with self._lock:
                if self.cut.is_set():
                    client.close()
                    server.close()
                    return
                self._socks += [client, server]
            for src, dst, up in ((client, server, True), (server, client, False)):
                threading.Thread(
                    target=self._pump, args=(src, dst, up), name="proxy-pump", daemon=True
                ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if up:
                    data = self._upstream(data, dst)
                    if data is None:
                        return
                dst.sendall(data)
                if up and self.cut_at is not None and self.sent_up >= self.cut_at:
                    self.close()
                    return
        except OSError:
            pass
        finally:  # one side ended: end the other too
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def _upstream(self, data: bytes, dst: socket.socket) -> bytes | None:
        """Account ``data`` going upstream: pause at the hold, trim at the cut. None: cut."""
        if self.hold_at is not None and not self._released.is_set():
            head = self.hold_at - self.sent_up
            if head <= len(data):
                if head > 0:
                    dst.sendall(data[:head])
                    self.sent_up += head
                    data = data[head:]
                self.holding.set()
                self._released.wait()
                if self.cut.is_set():
                    return None
        if self.cut_at is not None:
            data = data[: max(self.cut_at - self.sent_up, 0)]
        self.sent_up += len(data)
        return data
