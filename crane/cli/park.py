"""``crane checkpoint`` and ``crane restore``: park a session to a file, bring it back anywhere.

The file is written and read by the daemon's host (the session's worker streams its device
memory straight to it), so paths are absolute paths on that host.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc

from crane.cli.control_client import ControlClient
from crane.cli.inventory import format_bytes

__all__ = ["cmd_checkpoint", "cmd_restore"]


def _fail(e: grpc.RpcError, what: str) -> int:
    print(f"crane: {what}: {e.details()}", file=sys.stderr)
    return 1


def cmd_checkpoint(args: argparse.Namespace) -> int:
    path = os.path.abspath(args.output)
    with ControlClient(args.daemon, timeout=None) as c:
        try:
            r = c.checkpoint(args.session, path, args.release)
        except grpc.RpcError as e:
            return _fail(e, f"checkpoint of session {args.session} failed")
    print(
        f"session {args.session}: {format_bytes(r.memory_bytes)} of device memory written to "
        f"{path} ({format_bytes(r.bytes)}) in {r.seconds:.2f} s; session is {r.state}"
    )
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    path = os.path.abspath(args.file)
    with ControlClient(args.restore_daemon or args.daemon, timeout=None) as c:
        try:
            r = c.restore(path, args.device)
        except grpc.RpcError as e:
            return _fail(e, f"restore of {path} failed")
    print(f"session {r.session_id} restored from {path} in {r.seconds:.2f} s")
    return 0
