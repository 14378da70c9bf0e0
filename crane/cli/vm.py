"""The VM commands: ``crane migrate DOMAIN``, ``crane libvirt-hook``, ``crane libvirt-watch``.

Only argument handling and display: the work is in :mod:`crane.vm`. ``crane migrate DOMAIN
--to DEST_URI`` shows a live table (VM memory and GPU memory moved, rounds, expected downtime)
or, with ``--json``, prints one JSON object per progress event and the result last.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.live import Live
from rich.table import Table

from crane.cli.inventory import format_bytes
from crane.vm.hook import HookConfig, install, run_hook
from crane.vm.migrate import MigrationRefused, VmMigration, VmMigrationFailed
from crane.vm.watch import Watcher
from crane.wire.address import default_address

__all__ = ["add_parsers", "cmd_migrate_domain"]


def _table(domain: str, e: dict[str, Any]) -> Table:
    t = Table(title=f"domain {domain}", show_header=False)
    vm = e.get("vm") or {}
    done, total = vm.get("memory_processed"), vm.get("memory_total")
    if total:
        t.add_row("VM memory", f"{format_bytes(int(done or 0))} of {format_bytes(int(total))}")
    t.add_row("VM iteration", str(vm.get("iteration", 0)))
    t.add_row(
        "GPU memory",
        f"{format_bytes(int(e.get('gpu_memory_bytes', 0)))} sent of "
        f"{format_bytes(int(e.get('gpu_session_bytes', 0)))}",
    )
    for s in e.get("sessions", []):
        t.add_row(f"session {s['session']}", f"{s['phase']} round {s['round']}")
    t.add_row("expected GPU stop", f"{1e3 * float(e.get('expected_gpu_downtime_s', 0)):.1f} ms")
    t.add_row("last event", str(e.get("event")))
    return t


def cmd_migrate_domain(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    live: Live | None = None
    lock = threading.Lock()

    def report(e: dict[str, Any]) -> None:
        with lock:
            if args.json:
                print(json.dumps(e), flush=True)
            elif live is not None and "sessions" in e:
                live.update(_table(args.domain, e))

    mig = VmMigration(
        domain=args.domain,
        source_uri=args.connect,
        dest_uri=args.to,
        dest_daemon=args.dest_daemon,
        source_daemon=args.daemon or "",
        migrate_uri=args.migrate_uri or "",
        listen_address=args.listen_address or "",
        timeout_s=args.timeout or 0.0,
        hold_timeout_s=args.hold_timeout,
        accept_lower_limits=args.accept_lower_limits,
        report=report,
    )
    old = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda *_: mig.cancel("interrupted (Ctrl-C)"))
    try:
        if args.json:
            result = mig.run()
        else:
            with Live(_table(args.domain, {}), console=console, transient=True) as live:
                result = mig.run()
    except (MigrationRefused, VmMigrationFailed) as e:
        print(f"crane: migration of domain {args.domain} failed: {e}", file=sys.stderr)
        return 1
    except grpc.RpcError as e:
        print(f"crane: migration of domain {args.domain} failed: {e.details()}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, old)
    if result.get("error"):
        print(f"crane: domain {args.domain} moved, but: {result['error']}", file=sys.stderr)
        return 1
    if not args.json:
        vmd = result.get("vm_downtime_s")
        print(
            f"domain {args.domain} migrated to {args.to} with {len(result['sessions'])} "
            f"session(s): total {result['total_s']:.2f} s, VM downtime "
            f"{'?' if vmd is None else f'{vmd * 1e3:.0f} ms'}"
        )
    return 0


def cmd_libvirt_hook(args: argparse.Namespace) -> int:
    cfg = HookConfig(args.daemon or default_address(), args.peer_address or "")
    if args.hook_args[:1] == ["install"]:
        path = install(cfg, Path(args.hooks_dir))
        print(f"installed {path} (restart libvirtd to pick it up)")
        return 0
    return run_hook(cfg, args.hook_args, sys.stdin, sys.stdout, sys.stderr)


def cmd_libvirt_watch(args: argparse.Namespace) -> int:
    def log(e: dict[str, Any]) -> None:
        print(json.dumps(e), flush=True)

    w = Watcher(args.uri, args.daemon or default_address(), log)
    signal.signal(signal.SIGTERM, lambda *_: w.stop())
    try:
        w.run()
    except KeyboardInterrupt:
        w.stop()
    return 0


def add_parsers(sub: Any) -> None:
    h = sub.add_parser(
        "libvirt-hook",
        help="libvirt qemu hook: move a Crane guest's GPU state with its VM "
        "(install: write hooks/qemu.d/crane)",
    )
    h.add_argument("hook_args", nargs="*", help="DOMAIN OPERATION SUB-OP EXTRA, or: install")
    h.add_argument("--peer-address", help="where other daemons reach this host's daemon")
    h.add_argument("--hooks-dir", default="/etc/libvirt/hooks", help="install: libvirt's hooks")
    h.set_defaults(func=cmd_libvirt_hook)
    w = sub.add_parser(
        "libvirt-watch", help="follow this host's libvirt events for the libvirt hook"
    )
    w.add_argument("--uri", default="qemu:///system", help="this host's libvirt")
    w.set_defaults(func=cmd_libvirt_watch)
