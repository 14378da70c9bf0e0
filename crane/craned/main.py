"""``craned``: the host daemon.

    craned --listen unix:///run/crane/crane.sock --listen tcp://127.0.0.1:7480 \\
           --backend sim:h100-80gb [--config /etc/crane/craned.toml]

Runs until SIGTERM/SIGINT, then reports NOT_SERVING on its health service, stops accepting,
ends every session (their workers exit and free their device memory) and removes its unix
sockets. Under systemd (``Type=notify``, :mod:`crane.craned.notify`) it reports READY=1 once it
listens, STATUS= lines as its state changes, STOPPING=1 when it shuts down, and pings the
watchdog (``WatchdogSec=``) while it is alive (:func:`watchdog_probe`).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from crane import __version__
from crane.api.errors import ProtocolError
from crane.craned.config import DaemonConfig, load_config
from crane.craned.health import DaemonHealth, probe_server
from crane.craned.notify import Notifier, Watchdog, watchdog_interval
from crane.craned.server import Listening, ServerTls, build_server
from crane.daemon.callers import Callers
from crane.daemon.devices import Device, resolve_devices
from crane.daemon.domains import DomainConfig, resolve_group
from crane.daemon.gpu_inventory import NvmlUnavailable, gpu_lost
from crane.daemon.metrics import start_exporter
from crane.daemon.sessions import SessionManager
from crane.daemon.vsock import CidResolver, VsockListener
from crane.daemon.worker_tcp import WorkerTcp, parse_port_range
from crane.daemon.workers import WorkerPool, spawner_responsive
from crane.host import logs
from crane.host.lifeline import PidFiles
from crane.host.logs import FORMATS
from crane.host.malloc import tune_malloc
from crane.wire.channel import TlsFiles

__all__ = ["main"]

log = logging.getLogger("craned")


def self_probe_target(bound: list[str], tls: ServerTls | None) -> str | None:
    """A plain gRPC target of the daemon's own server for its watchdog probe: a unix
    listener, else a plain tcp one (None: only mutual-TLS listeners, which need a client
    certificate the daemon may not have)."""
    for b in bound:
        if b.startswith("unix://"):
            return "unix:" + b[len("unix://") :]
    if tls is None:
        for b in bound:
            if b.startswith("tcp://"):
                return b[len("tcp://") :]
    return None


def device_condition(devices: list[Device]) -> Callable[[], str | None]:
    """The daemon cannot serve sessions when every GPU it serves is lost (NVML says so); one
    lost among several is logged once: the others still serve."""
    gpus = [d for d in devices if d.backend == "cuda"]
    reported: set[str] = set()

    def devices_present() -> str | None:
        if not gpus:
            return None  # simulated devices cannot be lost
        lost = []
        for d in gpus:
            try:
                why = gpu_lost(int(d.arg))
            except NvmlUnavailable:
                return None  # no NVML: cannot tell (the cuda backend still may serve)
            if why:
                lost.append(why)
                if why not in reported:
                    log.error("device %d lost: %s", d.index, why)
                    reported.add(why)
        if len(lost) == len(gpus):
            return "every GPU is lost: " + "; ".join(lost)
        return None

    return devices_present


def watchdog_probe(
    target: str | None, health: DaemonHealth, interval: float
) -> Callable[[], str | None]:
    """Whether the daemon is alive enough for systemd's watchdog: its server answers a health
    check on itself, the health monitor keeps evaluating, the worker spawner runs. Not whether
    it is SERVING: a daemon that answers but lost its GPU is not wedged, and a restart loop
    would not bring the GPU back."""
    timeout = max(0.5, min(5.0, interval / 2))

    def alive() -> str | None:
        if target is not None:
            why = probe_server(target, timeout)
            if why:
                return why
        stale = health.stale_for(max(30.0, 3 * health.period + 30.0))
        if stale:
            return stale
        if not spawner_responsive(timeout):
            return f"the worker spawner thread has not answered in {timeout:.1f} s"
        return None

    return alive


def domain_flags(flags: list[str]) -> dict[str, DomainConfig]:
    """``--domain NAME[=TENANT]`` flags as ``[domains.*]`` tables say the same."""
    out = {}
    for flag in flags:
        name, _, tenant = flag.partition("=")
        out[name] = DomainConfig.from_table(name, {"tenant": tenant} if tenant else {})
    return out


def worker_endpoints(cfg: DaemonConfig, listening: Listening) -> WorkerTcp | None:
    """Workers' own TCP endpoints on the host of the first tcp listener bound, with its TLS
    files and caller rules (None: no ``worker_tcp_ports``, or no tcp listener)."""
    ports = parse_port_range(cfg.worker_tcp_ports)
    tcp = [b for b in listening.bound if b.startswith("tcp://")]
    if not ports:
        return None
    if not tcp:
        log.warning("worker_tcp_ports is set but craned has no tcp listener; ignored")
        return None
    host = tcp[0][len("tcp://") :].rsplit(":", 1)[0]
    log.info("workers serve remote guests on %s ports %d-%d", host, ports.start, ports.stop - 1)
    return WorkerTcp(
        host,
        ports,
        cfg.tls_cert,
        cfg.tls_key,
        cfg.client_ca,
        cfg.tenants,
        cfg.peers,
        cfg.insecure_tcp,
    )


def serve_vm_guests(cfg: DaemonConfig, listening: Listening) -> VsockListener | None:
    """Serve the configured domains' sockets, and the vsock port bridged to them (if any)."""
    assert listening.domains is not None
    listening.domains.attach_configured()
    if not cfg.vsock_port:
        return None
    resolver = CidResolver(cfg.vsock_libvirt_uri)
    vsock = VsockListener(cfg.vsock_port, resolver.domain_of, listening.domains.socket_of)
    log.info(
        "vsock port %d: bridged to the domain sockets by CID (libvirt %s)",
        cfg.vsock_port,
        cfg.vsock_libvirt_uri,
    )
    return vsock


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
    p.add_argument(
        "--log-format",
        choices=FORMATS,
        help="text (default) or json: one object per line with ts, level, logger, msg and the "
        "session, tenant and domain a line is about (workers' lines too)",
    )
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
    p.add_argument(
        "--worker-tcp-ports",
        metavar="FIRST-LAST",
        help="each session's worker serves remote guests on a port of this range (same TLS "
        "and caller rules as the tcp listener), so their calls skip the daemon's relay",
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
    p.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (default: none)",
    )
    p.add_argument(
        "--no-accounting",
        dest="accounting",
        action="store_false",
        default=None,
        help="no per-session accounting or profiles (crane profile, crane top, crane_ metrics)",
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
                "log_format": args.log_format,
                "prespawn": args.prespawn,
                "moved_ttl_s": args.moved_ttl,
                "parked_ttl_s": args.parked_ttl,
                "tls_cert": args.tls_cert,
                "tls_key": args.tls_key,
                "client_ca": args.client_ca,
                "peers": args.peer,
                "insecure_tcp": args.insecure_tcp,
                "worker_tcp_ports": args.worker_tcp_ports,
                "checkpoint_dir": args.checkpoint_dir,
                "module_cache_bytes": args.module_cache_bytes,
                "domains": domain_flags(args.domain) or None,  # none given: the file's
                "domain_socket_group": args.domain_socket_group,
                "vsock_port": args.vsock_port,
                "vsock_libvirt_uri": args.vsock_libvirt_uri,
                "metrics_listen": args.metrics_listen,
                "accounting": args.accounting,
            },
        )
    except (OSError, ValueError) as e:
        print(f"craned: {e}", file=sys.stderr)
        return 2
    logs.setup(cfg.log_level, cfg.log_format, "craned")
    tune_malloc()
    notifier = Notifier()
    notifier.status("starting: resolving devices")
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
    pool = WorkerPool(cfg.prespawn, cfg.log_level, pids, cfg.log_format)
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
            accounting=cfg.accounting,
            profile_window_s=cfg.profile_window_s,
            call_ring=cfg.call_ring,
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
    health = DaemonHealth([pool.check, device_condition(devices)])
    try:
        server, listening = build_server(
            sessions,
            cfg.listen,
            note,
            callers,
            tls,
            cfg.domains,
            resolve_group(cfg.domain_socket_group),
            health,
        )
    except (OSError, RuntimeError, ValueError) as e:
        log.error("cannot listen: %s", e)
        pool.close()
        return 2
    sessions.worker_tcp = worker_endpoints(cfg, listening)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s; shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:  # ready before the main socket answers: whoever waits for it may use them
        vsock = serve_vm_guests(cfg, listening)
    except (ProtocolError, OSError) as e:
        log.error("cannot serve VM guests: %s", getattr(e, "message", None) or e)
        pool.close()
        listening.close()
        return 2
    exporter = None
    if cfg.metrics_listen:
        try:
            exporter, _port = start_exporter(cfg.metrics_listen, sessions)
        except (OSError, ValueError) as e:
            log.error("cannot serve metrics on %s: %s", cfg.metrics_listen, e)
            if vsock is not None:
                vsock.close()
            pool.close()
            listening.close()
            return 2
    server.start()
    listening.open_up()
    for b in listening.bound:
        log.info("listening on %s", b)
    serving = f"serving {len(devices)} device(s) on {', '.join(listening.bound)}"

    def tell_status(problem: str | None) -> None:
        notifier.status(f"unhealthy: {problem}" if problem else serving)

    health.on_change(tell_status)
    health.ready()
    notifier.ready(serving if health.problem is None else f"unhealthy: {health.problem}")
    watchdog = None
    interval = watchdog_interval()
    if interval is not None and notifier.enabled:
        probe = watchdog_probe(self_probe_target(listening.bound, tls), health, interval)
        watchdog = Watchdog(notifier, interval, probe)
        watchdog.start()
    stop.wait()
    # NOT_SERVING first: balancers and orchestrators stop sending guests before any session ends
    health.shutting_down()
    if watchdog is not None:
        watchdog.stop()
    notifier.stopping(f"stopping: ending {len(sessions.list())} session(s)")
    if vsock is not None:
        vsock.close()
    server.stop(grace=1.0)
    if exporter is not None:
        exporter.shutdown()
    sessions.close_all("daemon shutting down")
    pool.close()
    listening.close()
    log.info("stopped")
    notifier.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
