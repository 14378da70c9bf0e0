"""``craned``: the host daemon.

    craned --listen unix:///run/crane/crane.sock --listen tcp://127.0.0.1:7480 \\
           --backend sim:h100-80gb [--config /etc/crane/craned.toml]

Runs until SIGTERM/SIGINT, then stops accepting, ends every session (their workers exit and
free their device memory) and removes its unix sockets. Under systemd (``Type=notify``) it
reports READY=1 once it listens and STOPPING=1 when it shuts down.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from crane import __version__
from crane.api.errors import ProtocolError
from crane.craned.config import load_config
from crane.craned.server import ServerTls, build_server
from crane.daemon.callers import Callers
from crane.daemon.devices import resolve_devices
from crane.daemon.domains import DomainConfig, resolve_group
from crane.daemon.sessions import SessionManager
from crane.daemon.vsock import CidResolver, VsockListener
from crane.daemon.workers import WorkerPool
from crane.host.lifeline import PidFiles
from crane.host.malloc import tune_malloc
from crane.wire.channel import TlsFiles

__all__ = ["main"]

log = logging.getLogger("craned")


def sd_notify(state: str) -> None:
    """Tell systemd about our state when it started us with Type=notify (no-op otherwise)."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.connect(addr)
            s.sendall(state.encode())
        except OSError as e:
            log.warning("sd_notify(%s) failed: %s", state, e)


def domain_flags(flags: list[str]) -> dict[str, DomainConfig]:
    """``--domain NAME[=TENANT]`` flags as ``[domains.*]`` tables say the same."""
    out = {}
    for flag in flags:
        name, _, tenant = flag.partition("=")
        out[name] = DomainConfig.from_table(name, {"tenant": tenant} if tenant else {})
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="craned", description="Crane host daemon")
    p.add_argument("--config", help="TOML configuration file")
    p.add_argument(
        "--listen",
        action="append",
        default=[],
        help="address to serve (repeatable): unix:///path.sock or tcp://host:port",
    )
    p.add_argument(
        "--backend",
        action="append",
        default=[],
        help="device backend (repeatable): auto, cuda[:N], sim:PROFILE; SPEC@MODEL tells "
        "guests MODEL (a built-in profile key or a model file, see crane baseline)",
    )
    p.add_argument("--run-dir", help="state directory (sockets, ledgers, module cache)")
    p.add_argument("--log-level", help="debug, info, warning, error")
    p.add_argument("--prespawn", type=int, help="idle workers to keep ready")
    p.add_argument(
        "--moved-ttl",
        type=float,
        metavar="SECONDS",
        help="keep a migrated-away session's entry (redirects its guest) this long; 0: forever "
        "(default 600)",
    )
    p.add_argument(
        "--parked-ttl",
        type=float,
        metavar="SECONDS",
        help="keep a parked session waiting for its restore this long, then fail its guest; "
        "0: until restored (default 3600)",
    )
    p.add_argument("--tls-cert", help="this daemon's certificate (PEM) for tcp:// listeners")
    p.add_argument("--tls-key", help="its private key (PEM)")
    p.add_argument(
        "--client-ca", help="CA (PEM) that signs the certificates tcp:// callers must present"
    )
    p.add_argument(
        "--peer",
        action="append",
        default=[],
        help="a daemon (certificate CN or SAN) allowed to migrate sessions here (repeatable)",
    )
    p.add_argument(
        "--insecure-tcp",
        action="store_true",
        default=None,
        help="plain TCP without TLS: every tcp caller is tenant 'tcp', an operator "
        "(development only)",
    )
    p.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="the only directory checkpoint files are written to and restored from "
        "(default RUN_DIR/checkpoints)",
    )
    p.add_argument(
        "--module-cache-bytes",
        metavar="SIZE",
        help="bound of the run directory's module image cache, e.g. 512MiB; least recently used "
        "images no session has loaded are evicted past it; 0: no bound (default 1GiB)",
    )
    p.add_argument(
        "--domain",
        action="append",
        default=[],
        metavar="NAME[=TENANT]",
        help="serve RUN_DIR/domains/NAME.sock for libvirt domain NAME's guest (repeatable); its "
        "sessions are tenant TENANT (default domain:NAME)",
    )
    p.add_argument(
        "--domain-socket-group", help="group owning the domain sockets (mode 0660; default root)"
    )
    p.add_argument(
        "--vsock-port",
        type=int,
        help="bridge AF_VSOCK connections on this port to the domain socket of the peer CID's "
        "libvirt domain (0: none)",
    )
    p.add_argument(
        "--vsock-libvirt-uri",
        help="libvirt URI a vsock peer's CID is resolved against (default qemu:///system)",
    )
    p.add_argument("--version", action="version", version=f"craned {__version__}")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(
            args.config,
            {
                "listen": args.listen,
                "backend": args.backend,
                "run_dir": args.run_dir,
                "log_level": args.log_level,
                "prespawn": args.prespawn,
                "moved_ttl_s": args.moved_ttl,
                "parked_ttl_s": args.parked_ttl,
                "tls_cert": args.tls_cert,
                "tls_key": args.tls_key,
                "client_ca": args.client_ca,
                "peers": args.peer,
                "insecure_tcp": args.insecure_tcp,
                "checkpoint_dir": args.checkpoint_dir,
                "module_cache_bytes": args.module_cache_bytes,
                "domains": domain_flags(args.domain),
                "domain_socket_group": args.domain_socket_group,
                "vsock_port": args.vsock_port,
                "vsock_libvirt_uri": args.vsock_libvirt_uri,
            },
        )
    except (OSError, ValueError) as e:
        print(f"craned: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=cfg.log_level.upper(),
        format="%(asctime)s craned %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    tune_malloc()
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        devices, note = resolve_devices(cfg.backend, run_dir)
    except (KeyError, ValueError) as e:
        log.error("%s", str(e).strip("\"'"))
        return 2
    log.info("craned %s: %s", __version__, note)
    tls = ServerTls(cfg.tls_cert, cfg.tls_key, cfg.client_ca) if cfg.tls_cert else None
    if tls is None and any(a.startswith("tcp://") for a in cfg.listen):
        log.warning(
            "insecure_tcp: tcp listeners are plain TCP and every tcp caller is tenant 'tcp', "
            "an operator; for development only"
        )
    callers = Callers(cfg.tenants, cfg.peers, cfg.insecure_tcp)

    pids = PidFiles(run_dir / "workers")
    killed = pids.sweep()  # a previous craned's workers, if it died with them still running
    if killed:
        log.warning("killed %d worker(s) of a previous run: %s", len(killed), killed)
    pool = WorkerPool(cfg.prespawn, cfg.log_level, pids)
    try:
        sessions = SessionManager(
            devices,
            run_dir,
            pool,
            cfg.max_sessions,
            moved_ttl_s=cfg.moved_ttl_s,
            parked_ttl_s=cfg.parked_ttl_s,
            tenants=cfg.tenants,
            peer_tls=TlsFiles(cfg.tls_cert, cfg.tls_key, cfg.client_ca),
            checkpoint_dir=Path(cfg.checkpoint_dir or run_dir / "checkpoints"),
            module_cache_bytes=cfg.module_cache_bytes,
        )
        refused = sessions.quotas.cuda_refusals([d.backend for d in devices])
        if refused:
            raise ValueError("; ".join(refused) + " (see README, Limits)")
    except ValueError as e:
        log.error("%s", e)
        pool.close()
        return 2
    except OSError as e:  # the checkpoint directory (or the run directory's) cannot be made
        log.error("cannot prepare %s: %s", e.filename or "a directory", e.strerror or e)
        pool.close()
        return 2
    log.info("checkpoint directory: %s", sessions.checkpoints.root)
    try:
        server, listening = build_server(
            sessions,
            cfg.listen,
            note,
            callers,
            tls,
            cfg.domains,
            resolve_group(cfg.domain_socket_group),
        )
    except (OSError, RuntimeError, ValueError) as e:
        log.error("cannot listen: %s", e)
        pool.close()
        return 2
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s; shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    listening.open_up()
    for b in listening.bound:
        log.info("listening on %s", b)
    try:
        listening.domains.attach_configured()
    except ProtocolError as e:
        log.error("cannot serve a domain socket: %s", e.message)
        server.stop(None)
        pool.close()
        listening.close()
        return 2
    vsock = None
    if cfg.vsock_port:
        try:
            resolver = CidResolver(cfg.vsock_libvirt_uri)
            vsock = VsockListener(cfg.vsock_port, resolver.domain_of, listening.domains.socket_of)
        except OSError as e:
            log.error("cannot listen on vsock port %d: %s", cfg.vsock_port, e)
            server.stop(None)
            pool.close()
            listening.close()
            return 2
        log.info(
            "vsock port %d: bridged to the domain sockets by CID (libvirt %s)",
            cfg.vsock_port,
            cfg.vsock_libvirt_uri,
        )
    sd_notify("READY=1")
    stop.wait()
    sd_notify("STOPPING=1")
    if vsock is not None:
        vsock.close()
    server.stop(grace=1.0)
    sessions.close_all("daemon shutting down")
    pool.close()
    listening.close()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
