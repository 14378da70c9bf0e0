"""A byte-level hop, measured: what a daemon would add if it spliced a VM guest's connection to
its worker's socket instead of relaying its gRPC messages.

A VM reaches craned through one forwarded port (QEMU guestfwd to the domain's unix socket), so
its worker cannot get a listener of its own that the VM can reach, and Python gRPC cannot adopt
an accepted connection (grpc issue #23760) for the daemon to hand it over with SCM_RIGHTS. What
is left is a proxy in the daemon's process that moves bytes without parsing them: ``splice(2)``
from one socket into a pipe and from the pipe into the other, one blocking thread per direction.
This module is that hop, in a process of its own (as the daemon is), for bench_relay to put in
front of a bare ping-pong and a worker's socket: measuring it decides whether building it into
the daemon would remove the relay's cost (docs/benchmarks.md).

    python benchmarks/splice_hop.py LISTEN_PATH UPSTREAM_PATH
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading

__all__ = ["serve"]

PIPE_BYTES = 1 << 20


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Move bytes ``src`` -> ``dst`` through a pipe, never into this process's memory."""
    r, w = os.pipe()
    try:
        while True:
            n = os.splice(src.fileno(), w, PIPE_BYTES)
            if n == 0:
                break
            while n:
                n -= os.splice(r, dst.fileno(), n)
    except OSError:
        pass
    finally:
        os.close(r)
        os.close(w)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def serve(listen: str, upstream: str) -> None:
    """Accept on unix ``listen``; splice each connection to a new one to ``upstream``."""
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(listen)
    lsock.listen(16)
    print("ready", flush=True)
    while True:
        client, _ = lsock.accept()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.connect(upstream)
        for a, b in ((client, server), (server, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
