"""``crane migrate --session ID --to ADDR``: move a running session to another daemon, live.

The source daemon drives the migration and streams its progress; this shows it with rich
(rounds, bytes, rate, estimated downtime) and prints the final downtime and total time.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from rich.console import Console
from rich.live import Live
from rich.table import Table

from crane.cli.inventory import format_bytes
from crane.v1 import control_pb2, control_pb2_grpc
from crane.wire.address import default_address
from crane.wire.channel import open_channel

__all__ = ["cmd_migrate", "migrate"]


def migrate(
    daemon: str | None,
    session: str,
    to: str,
    device: int = -1,
    max_rounds: int = 0,
    stop_bytes: int = 0,
    accept_lower_limits: bool = False,
) -> list[control_pb2.MigrateProgress]:
    """Run a migration; every progress message (the last is done or failed). Raises RpcError
    when the source refuses to start it."""
    with open_channel(daemon or default_address()) as ch:
        stub = control_pb2_grpc.MigrationStub(ch)
        req = control_pb2.MigrateRequest(
            session_id=session,
            to=to,
            device=device,
            max_rounds=max_rounds,
            stop_bytes=stop_bytes,
            accept_lower_limits=accept_lower_limits,
        )
        return list(stub.Migrate(req))


def _table(p: control_pb2.MigrateProgress, session: str, to: str) -> Table:
    t = Table(title=f"session {session} -> {to}", show_header=False)
    t.add_row("phase", p.phase)
    t.add_row("round", str(p.round))
    t.add_row("sent", f"{format_bytes(p.bytes_sent)} ({format_bytes(p.memory_bytes)} memory)")
    if p.handed_over_bytes:  # a destination on this host: mapped there, not copied
        t.add_row("handed over", format_bytes(p.handed_over_bytes))
    t.add_row("session memory", format_bytes(p.session_bytes))
    t.add_row("dirty", format_bytes(p.dirty_bytes))
    t.add_row("rate", f"{format_bytes(int(p.rate))}/s")
    t.add_row("est. downtime", f"{p.est_downtime * 1e3:.1f} ms")
    if p.phase == "done":
        t.add_row("downtime", f"{p.downtime * 1e3:.1f} ms")
        t.add_row("total", f"{p.total:.2f} s")
    return t


def cmd_migrate(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    last = control_pb2.MigrateProgress()
    req = control_pb2.MigrateRequest(
        session_id=args.session,
        to=args.to,
        device=args.device,
        max_rounds=1 if args.no_precopy else args.rounds,
        stop_bytes=args.stop_mib << 20,
        boundary_wait_s=args.timeout,
        accept_lower_limits=args.accept_lower_limits,
    )
    try:
        with (
            open_channel(args.daemon or default_address()) as ch,
            Live(_table(last, args.session, args.to), console=console, transient=True) as live,
        ):
            for last in control_pb2_grpc.MigrationStub(ch).Migrate(req):
                live.update(_table(last, args.session, args.to))
    except grpc.RpcError as e:
        print(f"crane: migration of session {args.session} failed: {e.details()}", file=sys.stderr)
        return 1
    if last.phase != "done":
        print(f"crane: migration of session {args.session} failed: {last.error}", file=sys.stderr)
        return 1
    handed = (
        f", {format_bytes(last.handed_over_bytes)} of memory handed over (not copied)"
        if last.handed_over_bytes
        else ""
    )
    print(
        f"session {args.session} migrated to {args.to}: {last.round + 1} round(s), "
        f"{format_bytes(last.bytes_sent)} sent{handed}; downtime {last.downtime * 1e3:.1f} ms, "
        f"total {last.total:.2f} s"
    )
    return 0
