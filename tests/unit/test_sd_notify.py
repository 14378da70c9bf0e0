"""crane.craned.notify on a real datagram socket: the notification format, the watchdog's
interval from systemd's variables, and pings withheld while the liveness probe fails."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from crane.craned.notify import Notifier, Watchdog, watchdog_interval


@pytest.fixture
def manager() -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket standing where systemd's would, and its NOTIFY_SOCKET value."""
    with tempfile.TemporaryDirectory(prefix="sdn", dir="/tmp") as d:
        path = str(Path(d) / "notify")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(path)
        s.settimeout(5)
        yield s, path
        s.close()


def test_one_datagram_per_notification(manager: tuple[socket.socket, str]) -> None:
    sock, path = manager
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.ready("serving")
    assert sock.recv(4096).decode().splitlines() == [
        "READY=1",
        f"MAINPID={os.getpid()}",
        "STATUS=serving",
    ]
    assert n.stopping("bye")
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=bye"
    n.close()


def test_without_notify_socket_nothing_is_sent() -> None:
    n = Notifier({})
    assert not n.enabled and not n.ready("x")
    assert not Notifier({"NOTIFY_SOCKET": "vsock:2:9"}).enabled


def test_watchdog_interval_follows_systemd() -> None:
    me = str(os.getpid())
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": me}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "soon"}) is None
    assert watchdog_interval({}) is None


def test_pings_stop_while_the_probe_fails(manager: tuple[socket.socket, str]) -> None:
    sock, path = manager
    wedged = threading.Event()
    dog = Watchdog(
        Notifier({"NOTIFY_SOCKET": path}), 0.05, lambda: "stuck" if wedged.is_set() else None
    )
    dog.start()
    try:
        assert sock.recv(4096) == b"WATCHDOG=1"
        wedged.set()
        got = [sock.recv(4096)]
        while got[-1] == b"WATCHDOG=1":  # the pings in flight before the probe failed
            got.append(sock.recv(4096))
        assert got[-1] == b"STATUS=unhealthy: stuck"
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(4096)  # nothing while it fails (and the status is said once)
        wedged.clear()
        sock.settimeout(5)
        assert sock.recv(4096) == b"WATCHDOG=1"
        assert sock.recv(4096) == b"STATUS=serving"
    finally:
        dog.stop()
