"""``crane doctor``: what is wrong with this machine's Crane set-up, and how to fix it.

    crane doctor --host [--config /etc/crane/craned.toml]   can this host run craned?
    crane doctor --guest [--daemon ADDR]                    can programs here reach a daemon?
    crane doctor [--json]                                   whichever this machine is

Without ``--host`` or ``--guest`` it checks the host side where this machine looks like a Crane
host (a craned configuration file, an NVIDIA driver, or craned's run directory) and the guest
side always (any machine may run guests, a host included). Every finding is ``ok``, ``warn``,
``fail`` or ``skip`` with what is wrong and the command that fixes it. Exit status: 0 nothing
failed (warnings allowed), 1 at least one check failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from crane.cli.doctor_findings import FAIL, Finding, print_findings
from crane.cli.doctor_guest import guest_findings
from crane.cli.doctor_host import DEFAULT_CONFIG, HOOKS_DIR, host_findings

__all__ = ["add_parser", "cmd_doctor", "looks_like_host"]


def looks_like_host() -> bool:
    """A craned configuration, an NVIDIA driver, or craned's run directory."""
    return any(
        Path(p).exists() for p in (DEFAULT_CONFIG, "/proc/driver/nvidia/version", "/run/crane")
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    host = args.host or (not args.guest and looks_like_host())
    guest = args.guest or not args.host
    findings: list[Finding] = []
    if host:
        findings += [_tag(f, "host") for f in host_findings(args.config, args.hooks_dir)]
    if guest:
        findings += [_tag(f, "guest") for f in guest_findings(args.daemon)]
    print_findings(findings, sys.stdout, args.json)
    return 1 if any(f.status == FAIL for f in findings) else 0


def _tag(f: Finding, side: str) -> Finding:
    return Finding(f"{side}: {f.check}", f.status, f.message, f.fix)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "doctor",
        help="check this machine's Crane set-up (host: driver, GPUs, config, sockets, "
        "certificates, libvirt hook; guest: library, daemon, protocol) and say how to fix it",
    )
    p.add_argument("--host", action="store_true", help="check the host side (craned)")
    p.add_argument("--guest", action="store_true", help="check the guest side")
    p.add_argument(
        "--config", help=f"craned's configuration file (default {DEFAULT_CONFIG} if it exists)"
    )
    p.add_argument(
        "--hooks-dir", default=HOOKS_DIR, help="libvirt's hooks directory (default %(default)s)"
    )
    p.add_argument("--json", action="store_true", help="the findings as one JSON object")
    p.set_defaults(func=cmd_doctor)
