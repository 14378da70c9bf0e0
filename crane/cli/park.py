"""``crane checkpoint`` and ``crane restore``: park a session to a file, bring it back anywhere.

The file is written and read by the daemon's host (the session's worker streams its device
memory straight to it), and only inside that daemon's checkpoint directory (craned
``--checkpoint-dir``): a name is taken relative to it, an absolute path must lie in it. The
daemon answers where the file went.
"""

from __future__ import annotations

import argparse
import sys

import grpc

from crane.cli.control_client import ControlClient
from crane.cli.inventory import format_bytes

__all__ = ["CHECKPOINT_TIMEOUT_S", "RESTORE_TIMEOUT_S", "cmd_checkpoint", "cmd_restore"]


#: Default deadlines of the calls (``--timeout``): a checkpoint waits for the session's call
#: in progress and writes its memory; a restore reads it back.
CHECKPOINT_TIMEOUT_S = 60.0
RESTORE_TIMEOUT_S = 300.0


def _fail(e: grpc.RpcError, what: str, timeout: float) -> int:
    """One line saying why; a time-out the daemon did not explain says what may have
    happened."""
    details = e.details() or ""
    if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and details == "Deadline Exceeded":
        details = (
            f"no answer within --timeout {timeout:g} s; the daemon may still finish it "
            "(crane ps shows the session's state)"
        )
    print(f"crane: {what}: {details}", file=sys.stderr)
    return 1


def cmd_checkpoint(args: argparse.Namespace) -> int:
    with ControlClient(args.daemon, timeout=args.timeout) as c:
        try:
            r = c.checkpoint(args.session, args.output, args.release)
        except grpc.RpcError as e:
            return _fail(e, f"checkpoint of session {args.session} failed", args.timeout)
    print(
        f"session {args.session}: {format_bytes(r.memory_bytes)} of device memory written to "
        f"{r.path} ({format_bytes(r.bytes)}) in {r.seconds:.2f} s; session is {r.state}"
    )
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    path = args.file
    with ControlClient(args.daemon, timeout=args.timeout) as c:
        try:
            r = c.restore(path, args.device, args.accept_lower_limits)
        except grpc.RpcError as e:
            return _fail(e, f"restore of {path} failed", args.timeout)
    print(f"session {r.session_id} restored from {path} in {r.seconds:.2f} s")
    return 0
