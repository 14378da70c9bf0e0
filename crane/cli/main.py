"""``crane``: the command-line front end (operators and guests).

    crane devices [--json]      devices the daemon serves
    crane ps [--json] [--domain NAME]  sessions: id, domain, peer, device, memory, calls, state
    crane demo                  a daemon on the simulated GPU and a CUDA workload through it
    crane run -- CMD ARGS...    run an unmodified CUDA program through the interposer
    crane guest-lib [--dir] [--python PY] [--build]  path of the interposer libcuda.so.1 (for
                                LD_PRELOAD / ld.so; --python: the one for that interpreter;
                                --build: build Crane's own for this interpreter first)
    crane checkpoint --session ID -o FILE [--release] [--timeout S]  write a session to a file
                                (and park it); S (60) bounds the call, a stuck session included
    crane restore FILE [--daemon ADDR] [--device N] [--timeout S]  recreate a checkpointed session
    crane migrate --session ID --to ADDR [--no-precopy] [--accept-lower-limits]  move a
        running session, live
    crane migrate DOMAIN --to DEST_LIBVIRT_URI --dest-daemon ADDR [-c SRC_URI] [--json]  live-
        migrate a libvirt VM and the GPU state of its Crane guest (crane/vm/migrate.py)
    crane libvirt-hook install | DOMAIN OP SUB-OP EXTRA  libvirt's qemu hook (crane/vm/hook.py)
    crane libvirt-watch [--uri URI]  the hook's event follower, one per host
    crane baseline ADDR... [-o FILE] [--name NAME]  the device model all those daemons' devices
                                can present (craned --backend SPEC@FILE)
    crane vsock-bridge --port P [--listen HOST:PORT]  (in a VM) loopback TCP -> craned's vsock
    crane profile SESSION [--json] [--top N]  a session's top kernels by GPU time, launches,
                                mean duration, and its kernel/copy/idle shares (profile window)
    crane top [--once] [--json] [--interval S]  devices and sessions, live (rich)
    crane doctor [--host [--config FILE]] [--guest] [--json]  what is wrong with this machine's
        set-up and how to fix it (crane/cli/doctor.py); exit 1 when a check fails

Global options, accepted before or after any subcommand (``crane --daemon X ps`` and ``crane ps
--daemon X`` are the same; after the subcommand wins when both are given): ``--daemon ADDR``
(or ``$CRANE_DAEMON``) picks the daemon. A ``tcp://`` daemon wants mutual TLS: ``--cert FILE
--key FILE --ca FILE`` (or ``$CRANE_TLS_CERT``, ``$CRANE_TLS_KEY``, ``$CRANE_TLS_CA``), which
``crane run`` passes on to the program it starts. They are declared once
(:data:`GLOBAL_OPTIONS`); every parser made by the subcommands' ``add_parser`` gets them
(:class:`SubcommandParser`), so a new subcommand needs nothing for them.

Subcommands only parse arguments and call the library; listings (``devices``, ``ps``) print a
table by default and JSON with ``--json``. Exit status: 0 done; 1 the daemon refused or could
not be reached, or the operation failed (one line on stderr, ``crane: ...``, with the reason);
2 bad usage (argparse's message, or a bad option value); 127 ``crane run`` could not start the
program (otherwise its status is the program's); 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys

from crane.cli import (
    baseline,
    demo,
    doctor,
    inventory,
    migrate,
    park,
    profile,
    run,
    top,
    vm,
    vsock_bridge,
)
from crane.wire.channel import TlsFiles

__all__ = ["GLOBAL_OPTIONS", "SubcommandParser", "add_global_options", "build_parser", "main"]


#: The options every command accepts, before or after its subcommand: (flag, help).
GLOBAL_OPTIONS: tuple[tuple[str, str], ...] = (
    ("--daemon", "daemon address (default: $CRANE_DAEMON or the system socket)"),
    ("--cert", "client certificate (PEM) for a tcp:// daemon ($CRANE_TLS_CERT)"),
    ("--key", "its private key (PEM) ($CRANE_TLS_KEY)"),
    ("--ca", "CA (PEM) the daemon's certificate must chain to ($CRANE_TLS_CA)"),
)


def add_global_options(parser: argparse.ArgumentParser, *, default: object = None) -> None:
    """Declare :data:`GLOBAL_OPTIONS` on ``parser``. A subcommand's copy defaults to
    ``argparse.SUPPRESS`` so that, not given there, it keeps what the top level parsed."""
    group = parser.add_argument_group("global options (before or after the subcommand)")
    for flag, text in GLOBAL_OPTIONS:
        group.add_argument(flag, default=default, help=text)


class SubcommandParser(argparse.ArgumentParser):
    """The parser of every subcommand (``add_subparsers(parser_class=...)``): it carries the
    global options, so ``crane SUBCOMMAND --daemon X`` works for each one, present and
    future."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        add_global_options(self, default=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="crane", description="Crane: CUDA remoting and migration")
    add_global_options(p)
    sub = p.add_subparsers(dest="command", required=True, parser_class=SubcommandParser)
    d = sub.add_parser("devices", help="list the daemon's devices")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=inventory.cmd_devices)
    s = sub.add_parser("ps", help="list sessions")
    s.add_argument("--json", action="store_true")
    s.add_argument("--domain", metavar="NAME", help="only the sessions of this libvirt domain")
    s.set_defaults(func=inventory.cmd_ps)
    m = sub.add_parser("demo", help="run the built-in demo on an embedded simulated-GPU daemon")
    m.add_argument("--profile", default="h100-80gb", help="simulated device profile")
    m.set_defaults(func=demo.cmd_demo)
    r = sub.add_parser("run", help="run a CUDA program with the interposer as its libcuda")
    r.add_argument("cmd", nargs=argparse.REMAINDER, help="-- PROGRAM ARGS...")
    r.set_defaults(func=run.cmd_run)
    g = sub.add_parser("guest-lib", help="print the interposer library's path")
    g.add_argument("--dir", action="store_true", help="print its folder instead")
    g.add_argument(
        "--build",
        action="store_true",
        help="(re)build Crane's own library for this interpreter first (an install made "
        "without a C compiler; needs cc and a shared libpython)",
    )
    g.add_argument(
        "--python",
        help="the library for this Python interpreter (an application's own; prepared and "
        "cached on first use)",
    )
    g.set_defaults(func=run.cmd_guest_lib)
    c = sub.add_parser("checkpoint", help="write a session's state to a file on the daemon host")
    c.add_argument("--session", required=True, help="session id (see crane ps)")
    c.add_argument(
        "-o",
        "--output",
        required=True,
        help="checkpoint file to write: a name in the daemon's checkpoint directory, or an "
        "absolute path inside it",
    )
    c.add_argument(
        "--release", action="store_true", help="free its GPU state: the session is parked"
    )
    c.add_argument(
        "--timeout",
        type=float,
        default=park.CHECKPOINT_TIMEOUT_S,
        metavar="SECONDS",
        help="give up after this long; a session whose call in progress does not return in "
        "time (a kernel that never ends) is left as it was (default %(default)g)",
    )
    c.set_defaults(func=park.cmd_checkpoint)
    t = sub.add_parser("restore", help="recreate a checkpointed session on a daemon")
    t.add_argument(
        "file", help="checkpoint file: a name in the daemon's checkpoint directory, or a path in it"
    )
    t.add_argument("--device", type=int, default=-1, help="device index on that daemon")
    t.add_argument(
        "--timeout",
        type=float,
        default=park.RESTORE_TIMEOUT_S,
        metavar="SECONDS",
        help="give up waiting for the daemon after this long (default %(default)g)",
    )
    t.add_argument(
        "--accept-lower-limits",
        action="store_true",
        help="the device may offer less than the guest was told at start (listed by the "
        "refusal): restore anyway when the session uses none of it; a later launch beyond the new "
        "device's limits fails as it would on that GPU (the other way: start guests under a "
        "baseline model, crane baseline)",
    )
    t.set_defaults(func=park.cmd_restore)
    v = sub.add_parser(
        "migrate", help="move a running session, or a VM with its sessions, to another host, live"
    )
    v.add_argument("domain", nargs="?", help="a libvirt domain to migrate (instead of --session)")
    v.add_argument("--session", help="session id (see crane ps)")
    v.add_argument(
        "--to",
        required=True,
        help="destination daemon address (--session), or destination libvirt URI (DOMAIN)",
    )
    v.add_argument("--device", type=int, default=-1, help="device index there")
    v.add_argument(
        "--rounds", type=int, default=8, help="rounds at most, the stop-and-copy included"
    )
    v.add_argument("--stop-mib", type=int, default=4, help="stop pre-copy below this dirty size")
    v.add_argument(
        "--no-precopy",
        action="store_true",
        help="stop-and-copy only: the guest stops while all of its memory moves",
    )
    v.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="--session: longest the migration waits on anyone: the session's call in progress "
        "each time it needs a call boundary, and the destination (its pre-flight answer, "
        "draining the transfer, acknowledging a round: no progress for this long); past it the "
        "migration fails and the session carries on here (default 60). DOMAIN: roll the whole "
        "migration back if it is not done by then (default: no limit)",
    )
    v.add_argument(
        "--accept-lower-limits",
        action="store_true",
        help="the destination may offer less than the guest was told at start (listed by the "
        "refusal): move anyway when the session uses none of it; a later launch beyond the new "
        "device's limits fails as it would on that GPU (the other way: start guests under a "
        "baseline model, crane baseline)",
    )
    v.add_argument("--dest-daemon", help="DOMAIN: the destination host's craned (peer address)")
    v.add_argument(
        "-c", "--connect", default="qemu:///system", help="DOMAIN: the source libvirt URI"
    )
    v.add_argument("--migrate-uri", help="DOMAIN: libvirt's data connection (e.g. tcp://HOST)")
    v.add_argument("--listen-address", help="DOMAIN: where the destination QEMU listens")
    v.add_argument(
        "--hold-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="DOMAIN: longest a session waits, frozen, for the VM's switchover (then aborts)",
    )
    v.add_argument("--json", action="store_true", help="DOMAIN: one JSON object per event")
    v.set_defaults(func=_migrate)
    baseline.add_parser(sub)
    profile.add_parser(sub)
    top.add_parser(sub)
    doctor.add_parser(sub)
    vm.add_parsers(sub)
    vsock_bridge.add_parser(sub)
    return p


def _migrate(args: argparse.Namespace) -> int:
    """The two forms of ``crane migrate``: a session (--session) or a libvirt domain."""
    if (args.domain is None) == (args.session is None):
        print("crane migrate: give either DOMAIN or --session ID", file=sys.stderr)
        return 2
    if args.session is not None:
        args.timeout = 60.0 if args.timeout is None else args.timeout
        return migrate.cmd_migrate(args)
    if not args.dest_daemon:
        print("crane migrate DOMAIN: --dest-daemon ADDR is required", file=sys.stderr)
        return 2
    return vm.cmd_migrate_domain(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cert or args.key or args.ca:
        try:
            tls = TlsFiles(args.cert or "", args.key or "", args.ca or "")
        except ValueError as e:
            print(f"crane: {e}", file=sys.stderr)
            return 2
        # every client of this process, and the program `crane run` starts, reads them there
        os.environ.update(tls.env())
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError) as e:  # a bad address, an unreadable file: one line, no trace
        print(f"crane {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
