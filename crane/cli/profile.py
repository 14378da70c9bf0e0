"""``crane profile SESSION [--json] [--top N]``: one session's kernels and time shares.

What the daemon answers from the session's published accounting (crane.v1.Control's
GetProfile): the top kernels by GPU time over the profile window, with launch counts and mean
duration, and the window's shares of time in kernels, in copies (and memsets) and idle.
"""

from __future__ import annotations

import argparse
import json
import sys

import grpc
from google.protobuf.json_format import MessageToDict

from crane.cli.control_client import ControlClient
from crane.cli.inventory import format_bytes, rpc_failure
from crane.v1 import control_pb2

__all__ = ["add_parser", "cmd_profile", "format_seconds", "render_profile"]


def format_seconds(s: float) -> str:
    """A duration in the unit that reads best (ns .. s)."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"


def render_profile(p: control_pb2.SessionProfile) -> str:
    """The profile as ``crane profile`` prints it."""
    s = p.session
    head = f"session {s.id}  tenant {s.tenant or '-'}  domain {s.domain or '-'}  device {s.device}"
    if not p.accounting:
        return head + f"\n  no profile: state {s.state}, or the daemon's accounting is off"
    lines = [
        head,
        f"window {p.window_seconds:g} s (the session covers {p.span_seconds:.1f} s of it): "
        f"kernels {p.kernel_share:.1%}  copies {p.copy_share:.1%}  idle {p.idle_share:.1%}",
        f"since start: {p.launches} launches, GPU busy {format_seconds(p.gpu_busy_seconds)}, "
        f"copied H2D {format_bytes(p.bytes_h2d)}  D2H {format_bytes(p.bytes_d2h)}  "
        f"D2D {format_bytes(p.bytes_d2d)}",
    ]
    if not p.kernels:
        lines.append("no kernel completed in the window")
        return "\n".join(lines)
    rows = [
        [
            k.name,
            format_seconds(k.gpu_seconds),
            f"{k.gpu_seconds / p.span_seconds:.1%}" if p.span_seconds else "-",
            str(k.launches),
            format_seconds(k.mean_seconds),
        ]
        for k in p.kernels
    ]
    headers = ["KERNEL", "GPU TIME", "OF WINDOW", "LAUNCHES", "MEAN"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines.append("")
    for r in [headers, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def cmd_profile(args: argparse.Namespace) -> int:
    with ControlClient(args.daemon) as c:
        try:
            reply = c.profiles(args.session, args.top)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                print(f"crane profile: {e.details()}", file=sys.stderr)
            else:
                print(f"crane: {rpc_failure(e, c.address)}", file=sys.stderr)
            return 1
    (p,) = reply.profiles
    if args.json:
        print(json.dumps(MessageToDict(p, always_print_fields_with_no_presence=True), indent=2))
    else:
        print(render_profile(p))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="a session's top kernels and time shares (profile window)")
    p.add_argument("session", help="session id (see crane ps)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--top", type=int, default=10, help="kernels to show (0: all; default 10)")
    p.set_defaults(func=cmd_profile)
