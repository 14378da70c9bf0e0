"""``crane vsock-bridge --port P [--listen HOST:PORT]``: in a VM's guest, a loopback TCP port
that reaches craned over vsock (CID 2, port P), for ``CRANE_DAEMON=vm://HOST:PORT``
(crane/wire/vsock_bridge.py says why a bridge)."""

from __future__ import annotations

import argparse
import logging
import sys

from crane.wire.vsock_bridge import VsockBridge

__all__ = ["add_parser", "cmd_vsock_bridge"]


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Registers ``crane vsock-bridge`` (main.py's one line)."""
    b = sub.add_parser(
        "vsock-bridge",
        help="(in a VM's guest) bridge a loopback TCP port to craned's vsock port on the host",
    )
    b.add_argument("--port", type=int, required=True, help="craned's vsock_port on the host")
    b.add_argument(
        "--listen",
        default="127.0.0.1:7000",
        metavar="HOST:PORT",
        help="where the guest's programs connect: CRANE_DAEMON=vm://HOST:PORT (%(default)s)",
    )
    b.set_defaults(func=cmd_vsock_bridge)


def cmd_vsock_bridge(args: argparse.Namespace) -> int:
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit() or not 0 < args.port < 1 << 32:
        print(f"crane: --listen HOST:PORT and --port N, not {args.listen!r}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s crane %(message)s")
    try:
        bridge = VsockBridge(args.port, (host, int(port)))
    except OSError as e:
        print(f"crane: cannot listen on {args.listen}: {e}", file=sys.stderr)
        return 1
    print(f"CRANE_DAEMON=vm://{host}:{bridge.address[1]}", flush=True)
    try:
        bridge.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        bridge.close()
    return 0
