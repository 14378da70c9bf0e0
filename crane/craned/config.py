"""craned's configuration: a TOML file and command-line flags saying the same things.

Example ``/etc/crane/craned.toml``::

    listen = ["unix:///run/crane/crane.sock", "tcp://127.0.0.1:7480"]
    backend = ["sim:h100-80gb"]        # or "auto", "cuda", "cuda:1"; repeat for more devices;
                                       # "cuda:0@a100-40gb" or "...@/etc/crane/pool.toml" tells
                                       # guests that model (crane/device/presented.py)
    run_dir = "/run/crane"
    log_level = "info"
    log_format = "text"                # or "json": one object per line (crane/host/logs.py)
    prespawn = 1                       # idle workers kept ready, so a session opens fast
    moved_ttl_s = 600                  # how long a migrated-away session's entry redirects
    parked_ttl_s = 3600                # how long a parked session waits for its restore
    module_cache_bytes = "1GiB"        # module images kept on disk (LRU; images in use stay)
    checkpoint_dir = "/var/lib/crane/checkpoints"  # the only place checkpoints are read/written
    metrics_listen = "127.0.0.1:9400"  # Prometheus /metrics (crane/daemon/metrics.py); "": off
    accounting = true                  # per-session call/GPU accounting and profiles (crane
                                       # profile, crane top, the crane_ metrics); false: off
    profile_window_s = 60              # the profiles' sliding window
    call_ring = true                   # guests on this host send calls through shared-memory
                                       # rings (crane/worker/ring.py); false: the gRPC socket

    # Mutual TLS on every tcp:// listener (and for migrations to other daemons).
    tls_cert = "/etc/crane/tls/craned.pem"
    tls_key = "/etc/crane/tls/craned.key"
    client_ca = "/etc/crane/tls/ca.pem"    # signs tenants' and peer daemons' certificates
    peers = ["craned-b.example"]           # daemons allowed to migrate sessions here (CN/SAN)
    insecure_tcp = false                   # true: plain TCP, every caller is tenant "tcp" and
                                           # an operator (development only; craned warns)
    worker_tcp_ports = "7481-7544"         # each session's worker listens on one (same TLS and
                                           # caller rules): remote guests skip the relay; "": off

    [tenants.alice]                        # who is who, and what each may use
    uids = [1001]                          # unix-socket callers (SO_PEERCRED uid, or gid)
    gids = []
    certs = ["alice"]                      # client certificates whose CN or a SAN is one of these
    operator = false                       # may use the control API on every tenant's sessions
    memory = "16GiB"                       # device memory across the tenant's sessions
    max_sessions = 4
    kernel_time_limit_s = 30               # simulated GPU: a longer launch fails LAUNCH_TIMEOUT

    # VM guests (crane/daemon/domains.py): each attached libvirt domain gets a socket
    # <run_dir>/domains/NAME.sock that its QEMU forwards the guest's vm:// address to; every
    # call on it is that domain's guest. More are attached at run time (crane.v1.Control's
    # AttachDomain, what `crane migrate DOMAIN` and the libvirt hook use).
    domain_socket_group = "libvirt-qemu"   # group of the domain sockets (mode 0660; default root)
    vsock_port = 7000                      # AF_VSOCK listener bridged to the domains' sockets
                                           # by the peer's CID (0: none)
    vsock_libvirt_uri = "qemu:///system"   # where a CID is resolved to its domain

    [domains.vm1]
    tenant = "alice"                       # default: domain:vm1

Flags given on the command line replace the file's value for that key.

Why the two lifetimes: a daemon keeps an entry for a session that left it. A *moved* entry (the
session migrated to another daemon) only redirects a guest that reconnects here to the new
daemon; a guest does so within seconds of the switchover, so ten minutes is generous. A *parked*
entry (``crane checkpoint --release``) is what a waiting guest polls: while it exists the guest
keeps waiting for the restore, and it holds one of the daemon's session slots and its VA window.
It must outlive the guests' own patience (``CRANE_RESUME_TIMEOUT_S``, 600 s by default) and an
operator's maintenance window, hence an hour. When an entry expires the daemon logs it and a
guest still waiting gets an error at once instead of waiting forever. 0 keeps entries until the
session comes back (parked) or the daemon stops.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from crane.daemon.domains import DomainConfig, resolve_group
from crane.daemon.tenants import TenantConfig, parse_size
from crane.daemon.worker_tcp import parse_port_range
from crane.host.logs import FORMATS

__all__ = ["DaemonConfig", "load_config"]


@dataclass
class DaemonConfig:
    listen: list[str] = field(default_factory=lambda: ["unix:///run/crane/crane.sock"])
    backend: list[str] = field(default_factory=lambda: ["auto"])
    run_dir: str = "/run/crane"
    log_level: str = "info"
    #: "text" (human lines) or "json" (one object per line, with the session, tenant and
    #: domain as fields): craned's and its workers' stderr (crane.host.logs).
    log_format: str = "text"
    prespawn: int = 1
    max_sessions: int = 64
    #: Seconds a migrated-away session's entry is kept (redirects its guest); 0: forever.
    moved_ttl_s: float = 600.0
    #: Seconds a parked session's entry waits for a restore; 0: until restored.
    parked_ttl_s: float = 3600.0
    #: The only directory checkpoint files are written to and restored from ("": the run
    #: directory's ``checkpoints``).
    checkpoint_dir: str = ""
    #: This daemon's certificate and key (PEM): served on tcp:// listeners, and presented as
    #: the client certificate when it migrates a session to another daemon.
    tls_cert: str = ""
    tls_key: str = ""
    #: The CA (PEM) that signs tenants' and peer daemons' certificates; tcp:// callers must
    #: present one it signed.
    client_ca: str = ""
    #: Daemons (certificate CN or SAN) allowed to migrate sessions to this one.
    peers: list[str] = field(default_factory=list)
    #: Plain TCP without TLS: every tcp caller is tenant "tcp" and an operator (a development
    #: setting; craned warns at start). Without it a tcp listener needs the three TLS files.
    insecure_tcp: bool = False
    #: Ports ("FIRST-LAST") the daemon hands its workers for their own TCP endpoints, on the
    #: host of its first tcp listener (crane.daemon.worker_tcp): remote guests carry their
    #: calls there, not through the daemon. "": none, remote guests use the relay.
    worker_tcp_ports: str | list[int] = ""
    tenants: dict[str, TenantConfig] = field(default_factory=dict)
    #: The most bytes of module images the run directory's store keeps; least recently used
    #: images no live session has loaded are evicted past it (crane.modules.store). 0: no bound.
    module_cache_bytes: int = 1 << 30
    #: libvirt domains whose sockets are served from the start (``[domains.NAME]``).
    domains: dict[str, DomainConfig] = field(default_factory=dict)
    #: Group (name or gid) owning the domain sockets, mode 0660 ("": root).
    domain_socket_group: str | int = ""
    #: AF_VSOCK port bridged to the domain sockets by the connecting CID's domain (0: none).
    vsock_port: int = 0
    #: The libvirt connection a vsock peer's CID is resolved against, per connection.
    vsock_libvirt_uri: str = "qemu:///system"
    #: Where the Prometheus exporter listens (HOST:PORT, :PORT); "": no exporter.
    metrics_listen: str = ""
    #: Workers count and time calls and GPU work (crane.engine.meter): the crane_ session and
    #: tenant metrics, ``crane profile``, ``crane top``. Off: none of those (the GPU metrics
    #: stay), and the call path does no accounting at all.
    accounting: bool = True
    #: The profiles' sliding window, in seconds.
    profile_window_s: float = 60.0
    #: Offer guests on this host the shared-memory call ring (crane.worker.ring); off: they
    #: use the worker's gRPC socket.
    call_ring: bool = True


_SECONDS = ("moved_ttl_s", "parked_ttl_s")


def load_config(path: Path | str | None, overrides: dict[str, object]) -> DaemonConfig:
    """Read the TOML file (if any), then apply non-empty command-line overrides."""
    cfg = DaemonConfig()
    known = {f.name for f in fields(DaemonConfig)}
    if path:
        with open(path, "rb") as f:
            data = tomllib.load(f)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{path}: unknown keys {sorted(unknown)}; known: {sorted(known)}")
        for k, v in data.items():
            if k in ("listen", "backend", "peers") and isinstance(v, str):
                v = [v]
            if k == "tenants":
                if not isinstance(v, dict):
                    raise ValueError(f"{path}: tenants must be tables [tenants.NAME]")
                v = {name: TenantConfig.from_table(name, t) for name, t in v.items()}
            if k == "domains":
                if not isinstance(v, dict):
                    raise ValueError(f"{path}: domains must be tables [domains.NAME]")
                v = {name: DomainConfig.from_table(name, t) for name, t in v.items()}
            setattr(cfg, k, v)
    for k, v in overrides.items():
        if v not in (None, [], {}, ""):  # {}: no --domain flags, keep the file's [domains]
            setattr(cfg, k, v)
    _check_tls(cfg)
    parse_port_range(cfg.worker_tcp_ports)  # refused at start when malformed
    if cfg.log_format not in FORMATS:
        raise ValueError(f"log_format must be one of {list(FORMATS)}, not {cfg.log_format!r}")
    try:
        cfg.module_cache_bytes = parse_size(cfg.module_cache_bytes)
    except ValueError as e:
        raise ValueError(f"module_cache_bytes: {e}") from None
    resolve_group(cfg.domain_socket_group)  # a group that does not exist: refused at start
    port = cfg.vsock_port
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 1 << 32:
        raise ValueError(f"vsock_port must be a port number (0: none), not {port!r}")
    if not isinstance(cfg.accounting, bool):
        raise ValueError(f"accounting must be true or false, not {cfg.accounting!r}")
    if not isinstance(cfg.call_ring, bool):
        raise ValueError(f"call_ring must be true or false, not {cfg.call_ring!r}")
    w = cfg.profile_window_s
    if isinstance(w, bool) or not isinstance(w, int | float) or not 1 <= w <= 86400:
        raise ValueError(f"profile_window_s must be a number of seconds in 1..86400, not {w!r}")
    cfg.profile_window_s = float(w)
    if not isinstance(cfg.metrics_listen, str):
        raise ValueError(f"metrics_listen must be HOST:PORT or empty, not {cfg.metrics_listen!r}")
    for k in _SECONDS:
        v = getattr(cfg, k)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{k} must be a number of seconds >= 0 (0: never expire), not {v!r}")
        setattr(cfg, k, float(v))
    return cfg


def _check_tls(cfg: DaemonConfig) -> None:
    """TLS files come all three or none; a tcp:// listener needs them, or ``insecure_tcp``."""
    given = {k: getattr(cfg, k) for k in ("tls_cert", "tls_key", "client_ca")}
    missing = [k for k, v in given.items() if not v]
    if missing and len(missing) < len(given):
        raise ValueError(f"TLS needs tls_cert, tls_key and client_ca; missing: {missing}")
    if not isinstance(cfg.insecure_tcp, bool):
        raise ValueError(f"insecure_tcp must be true or false, not {cfg.insecure_tcp!r}")
    if not isinstance(cfg.peers, list) or not all(isinstance(p, str) and p for p in cfg.peers):
        raise ValueError("peers must be a list of certificate names")
    tcp = [a for a in cfg.listen if not a.strip().startswith("unix:")]
    if tcp and missing and not cfg.insecure_tcp:
        raise ValueError(
            f"listening on {tcp[0]} needs mutual TLS (tls_cert, tls_key, client_ca; "
            "--tls-cert/--tls-key/--client-ca), or insecure_tcp = true (--insecure-tcp; "
            "development only: every tcp caller becomes an operator)"
        )
