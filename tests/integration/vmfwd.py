"""A VM's guest forward, on the host: what QEMU's ``guestfwd=tcp:IP:PORT-cmd:socat - UNIX-CONNECT:
<domain socket>`` does for a guest, made with the same socat from a loopback TCP port, so the
``vm://`` transport and the domain sockets are tested without a VM. :meth:`Forward.repoint`
kills it and forwards the same port to another socket (a VM that moved to another host)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

__all__ = ["Forward"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Forward:
    """``vm://127.0.0.1:PORT`` reaching the unix socket ``target`` (a domain socket)."""

    def __init__(self, target: Path | str, port: int | None = None) -> None:
        if shutil.which("socat") is None:
            pytest.skip("socat is not installed (QEMU's guestfwd uses it too)")
        self.port = port or _free_port()
        self.address = f"vm://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start(target)

    def start(self, target: Path | str) -> None:
        self.target = Path(target)
        self.proc = subprocess.Popen(
            [
                "socat",
                f"TCP-LISTEN:{self.port},bind=127.0.0.1,reuseaddr,fork",
                f"UNIX-CONNECT:{self.target}",
            ],
            stdin=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its per-connection children share its process group
        )
        deadline = time.monotonic() + 10
        while True:  # listening once a connection is accepted
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"socat does not listen on {self.port}")
            time.sleep(0.02)

    def stop(self) -> None:
        """Kill socat and its children (every forwarded connection resets, as in a migration)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # socat and its per-connection children
        self.proc.wait()
        self.proc = None

    def repoint(self, target: Path | str) -> None:
        self.stop()
        self.start(target)

    def close(self) -> None:
        self.stop()
