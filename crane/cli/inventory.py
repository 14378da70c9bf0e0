"""``crane devices`` and ``crane ps``."""

from __future__ import annotations

import argparse
import json
import sys
import time

import grpc
from google.protobuf.json_format import MessageToDict

from crane.cli.control_client import ControlClient

__all__ = ["cmd_devices", "cmd_ps", "format_bytes", "rpc_failure"]


def rpc_failure(e: grpc.RpcError, address: str) -> str:
    """One line for a failed call: a refusal says why (the daemon's reason), anything else
    that the daemon could not be reached."""
    if e.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        return f"refused by the daemon at {address}: {e.details()}"
    hint = ""
    if address.startswith("tcp://") and e.code() == grpc.StatusCode.UNAVAILABLE:
        hint = " (a TLS listener refuses clients without a certificate its CA signed: --cert ...)"
    return f"cannot reach the daemon at {address}: {e.details()}{hint}"


def format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    return "\n".join(lines)


def _show(  # type: ignore[no-untyped-def]
    args: argparse.Namespace, what: str, headers: list[str], rows, more=(), more_rows=None
) -> int:
    """Fetch ``what`` from the daemon and print it as JSON or as a table of ``rows(reply)``
    (and, when ``more_rows(reply)`` has any, a second table with the headers ``more``)."""
    with ControlClient(args.daemon) as c:
        try:
            reply = (
                c.devices() if what == "devices" else c.sessions(getattr(args, "domain", "") or "")
            )
        except grpc.RpcError as e:
            print(f"crane: {rpc_failure(e, c.address)}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(MessageToDict(reply, always_print_fields_with_no_presence=True), indent=2))
    else:
        print(_table(headers, rows(reply)))
        extra = more_rows(reply) if more_rows is not None else []
        if extra:
            print()
            print(_table(list(more), extra))
    return 0


_DEVICE_COLUMNS = [
    "IDX",
    "NAME",
    "CC",
    "BACKEND",
    "PROFILE",
    "MODEL",
    "MEMORY",
    "USED",
    "SESSIONS",
    "UTIL",
    "MIG",
    "DRIVER",
    "UUID",
]
_TENANT_COLUMNS = ["TENANT", "MEMORY", "LIMIT", "SESSIONS", "MAX"]
_SESSION_COLUMNS = [
    "SESSION",
    "TENANT",
    "DOMAIN",
    "STATE",
    "DEV",
    "MODEL",
    "MEMORY",
    "CALLS",
    "AGE",
    "TRANSPORT",
    "PEER",
    "CLIENT",
]


def _presented(d) -> str:  # type: ignore[no-untyped-def]
    """The model a device tells its guests: "-" for its own identity, else the model's key,
    its compute capability and the memory guests may use."""
    if not d.model:
        return "-"
    return f"{d.model} ({d.model_cc_major}.{d.model_cc_minor}, {format_bytes(d.model_total_mem)})"


def cmd_devices(args: argparse.Namespace) -> int:
    def rows(reply):  # type: ignore[no-untyped-def]
        return [
            [
                str(d.index),
                d.name,
                f"{d.cc_major}.{d.cc_minor}",
                d.backend,
                d.profile,
                _presented(d),
                format_bytes(d.total_mem),
                format_bytes(d.used_mem),
                str(d.sessions),
                "-" if d.utilization_pct < 0 else f"{d.utilization_pct}%",
                d.mig_mode,
                d.driver_version,
                d.uuid,
            ]
            for d in reply.devices
        ]

    def tenants(reply):  # type: ignore[no-untyped-def]
        def limit(n: int, fmt) -> str:  # type: ignore[no-untyped-def]
            return "-" if n < 0 else fmt(n)

        return [
            [
                t.name,
                format_bytes(t.memory_used),
                limit(t.memory_limit, format_bytes),
                str(t.sessions),
                limit(t.max_sessions, str),
            ]
            for t in reply.tenants
        ]

    return _show(args, "devices", _DEVICE_COLUMNS, rows, _TENANT_COLUMNS, tenants)


def cmd_ps(args: argparse.Namespace) -> int:
    now = time.time()

    def rows(reply):  # type: ignore[no-untyped-def]
        return [
            [
                s.id,
                s.tenant or "-",
                s.domain or "-",
                f"{s.state} {s.location}" if s.location else s.state,
                str(s.device),
                s.model or "-",
                format_bytes(s.mem_used),
                str(s.calls),
                f"{now - s.opened_at:.0f}s",
                s.transport or "-",
                s.peer,
                s.client,
            ]
            for s in reply.sessions
        ]

    return _show(args, "sessions", _SESSION_COLUMNS, rows)
