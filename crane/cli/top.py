"""``crane top``: devices and sessions, live in the terminal (rich), refreshing.

    crane top [--interval S]     live until Ctrl-C
    crane top --once             one frame, printed (scripts, tests)
    crane top --json             one sample as JSON: {"devices": [...], "sessions": [...]}

Each frame is three Control calls (ListDevices, GetProfile of every session the caller may
see); the profiles are what the workers last published, so a session inside a long kernel
shows at once. Call rates come from the difference between two frames (live mode only).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from crane.cli.control_client import ControlClient
from crane.cli.inventory import format_bytes, rpc_failure
from crane.cli.profile import format_seconds
from crane.v1 import control_pb2

__all__ = ["add_parser", "cmd_top", "frame"]


def _sample(c: ControlClient) -> tuple[control_pb2.ListDevicesReply, control_pb2.ProfileReply]:
    return c.devices(), c.profiles("", 1)


def frame(
    devices: control_pb2.ListDevicesReply,
    profiles: control_pb2.ProfileReply,
    rates: dict[str, float] | None = None,
) -> Group:
    """One screen: the devices table, then the sessions table."""
    dt = Table(title="devices", title_justify="left", expand=False)
    for h in ("IDX", "NAME", "BACKEND", "MEMORY USED", "UTIL", "SESSIONS"):
        dt.add_column(h)
    for d in devices.devices:
        dt.add_row(
            str(d.index),
            d.name,
            d.backend if d.backend != "sim" else f"sim:{d.profile}",
            f"{format_bytes(d.used_mem)} / {format_bytes(d.total_mem)}",
            "-" if d.utilization_pct < 0 else f"{d.utilization_pct}%",
            str(d.sessions),
        )
    st = Table(title="sessions", title_justify="left", expand=False)
    for h in (
        "SESSION",
        "TENANT",
        "DOMAIN",
        "DEV",
        "STATE",
        "MEMORY",
        "CALLS",
        "CALLS/S",
        "LAUNCHES",
        "KERNEL",
        "COPY",
        "IDLE",
        "TOP KERNEL",
    ):
        st.add_column(h, no_wrap=True)
    for p in profiles.profiles:
        s = p.session
        rate = (rates or {}).get(s.id)
        if p.accounting:
            shares = [f"{p.kernel_share:.0%}", f"{p.copy_share:.0%}", f"{p.idle_share:.0%}"]
            top = "-"
            if p.kernels:
                k = p.kernels[0]
                top = f"{k.name} ({format_seconds(k.gpu_seconds)}, {k.launches}x)"
            launches = str(p.launches)
        else:
            shares, top, launches = ["-"] * 3, "-", "-"
        st.add_row(
            s.id,
            s.tenant or "-",
            s.domain or "-",
            str(s.device),
            s.state,
            format_bytes(s.mem_used),
            str(s.calls),
            "-" if rate is None else f"{rate:,.0f}",
            launches,
            *shares,
            top,
        )
    return Group(dt, st)


def _as_json(devices: control_pb2.ListDevicesReply, profiles: control_pb2.ProfileReply) -> str:
    def d(m: Any) -> Any:
        return MessageToDict(m, always_print_fields_with_no_presence=True)

    return json.dumps(
        {
            "devices": [d(x) for x in devices.devices],
            "sessions": [d(p) for p in profiles.profiles],
        },
        indent=2,
    )


def cmd_top(args: argparse.Namespace) -> int:
    with ControlClient(args.daemon) as c:
        try:
            devices, profiles = _sample(c)
            if args.json:
                print(_as_json(devices, profiles))
                return 0
            if args.once:
                # rich honours a width only when a height comes with it: alone, a console it
                # takes for a dumb terminal (TERM=dumb with FORCE_COLOR, as CI runners set)
                # is 80 columns wide and the sessions table loses its ids to ellipses.
                size = shutil.get_terminal_size((200, 50))
                console = Console(width=max(size.columns, 160), height=size.lines)
                console.print(frame(devices, profiles))
                return 0
            return _live(c, args.interval, devices, profiles)
        except grpc.RpcError as e:
            print(f"crane: {rpc_failure(e, c.address)}", file=sys.stderr)
            return 1


def _live(
    c: ControlClient,
    interval: float,
    devices: control_pb2.ListDevicesReply,
    profiles: control_pb2.ProfileReply,
) -> int:
    """Refresh every ``interval`` seconds until interrupted."""
    last = {p.session.id: p.session.calls for p in profiles.profiles}
    t_last = time.monotonic()
    with Live(frame(devices, profiles), auto_refresh=False, screen=False) as live:
        try:
            while True:
                time.sleep(interval)
                devices, profiles = _sample(c)
                now = time.monotonic()
                rates = {
                    p.session.id: (p.session.calls - last[p.session.id]) / (now - t_last)
                    for p in profiles.profiles
                    if p.session.id in last
                }
                last = {p.session.id: p.session.calls for p in profiles.profiles}
                t_last = now
                live.update(frame(devices, profiles, rates), refresh=True)
        except KeyboardInterrupt:
            return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("top", help="devices and sessions, live (rich); --once / --json: one sample")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="refresh period")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--json", action="store_true", help="print one sample as JSON and exit")
    p.set_defaults(func=cmd_top)
