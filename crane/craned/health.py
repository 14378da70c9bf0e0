"""craned's readiness and health: the standard gRPC health service (``grpc.health.v1.Health``)
on every listener, and the conditions behind its statuses.

Statuses, overall (``""``) and per service:

* ``NOT_SERVING`` from start until the devices are resolved and every listener (the domain
  sockets and the vsock bridge included) is bound; ``SERVING`` from then on;
* ``NOT_SERVING`` for the services that need a new worker (``""``, ``crane.v1.Guest``: a
  session, ``crane.v1.Peer``: an incoming migration) while the daemon cannot serve one: a
  worker cannot be spawned or every idle one died before use (the pool says why), or every
  device it serves is a GPU NVML reports lost. ``crane.v1.Control``, ``crane.v1.Migration`` and
  ``crane.v1.Diagnostics`` stay ``SERVING`` then: an operator can still list, checkpoint and
  move sessions away;
* ``NOT_SERVING`` for all, for good, once shutdown begins (before any session is closed), so a
  load balancer or an orchestrator stops sending new guests first.

The service reveals nothing about sessions or tenants, so it is served to every caller without
an identity (none of the daemon's services resolves one before its own methods run; tcp
listeners still require their TLS client certificate at the handshake). The reasons behind a
``NOT_SERVING`` go to the log and to systemd's ``STATUS=``, not over the wire.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2

__all__ = [
    "ALL_SERVICES",
    "NEEDS_WORKERS",
    "OVERALL",
    "DaemonHealth",
    "health_handler",
    "probe_server",
]

log = logging.getLogger("craned")

OVERALL = ""
#: Services that cannot do their job without spawning a worker (sessions, incoming moves).
NEEDS_WORKERS = (OVERALL, "crane.v1.Guest", "crane.v1.Peer")
#: Every service craned serves, by its full name, as health checks ask for it.
ALL_SERVICES = (*NEEDS_WORKERS, "crane.v1.Control", "crane.v1.Migration", "crane.v1.Diagnostics")

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

#: One check of a condition: None when fine, else why the daemon cannot serve sessions.
Condition = Callable[[], str | None]


def health_handler(servicer: health.HealthServicer) -> grpc.GenericRpcHandler:
    """The Health service as a generic handler (the daemon's main server and each domain's
    server share one servicer, so they report the same statuses)."""
    return grpc.method_handlers_generic_handler(
        health.SERVICE_NAME,
        {
            "Check": grpc.unary_unary_rpc_method_handler(
                servicer.Check,
                request_deserializer=health_pb2.HealthCheckRequest.FromString,
                response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
            ),
            "Watch": grpc.unary_stream_rpc_method_handler(
                servicer.Watch,
                request_deserializer=health_pb2.HealthCheckRequest.FromString,
                response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
            ),
        },
    )


class DaemonHealth:
    """The statuses and what drives them: :meth:`ready`, :meth:`shutting_down`, and a monitor
    thread that re-evaluates ``conditions`` every ``period`` seconds once ready."""

    def __init__(self, conditions: Sequence[Condition] = (), period: float = 2.0) -> None:
        # non-blocking Watch: a watcher holds no server thread while it waits for a change
        self.servicer = health.HealthServicer(experimental_non_blocking=True)
        for name in ALL_SERVICES:
            self.servicer.set(name, NOT_SERVING)
        self.conditions = list(conditions)
        self.period = period
        self.problem: str | None = "starting"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_change: list[Callable[[str | None], None]] = []
        self.evaluated = time.monotonic()

    def handler(self) -> grpc.GenericRpcHandler:
        return health_handler(self.servicer)

    def on_change(self, callback: Callable[[str | None], None]) -> None:
        """Call ``callback(problem)`` whenever the daemon's problem changes (None: healthy)."""
        self._on_change.append(callback)

    def ready(self) -> None:
        """Listeners bound and started: evaluate the conditions, then keep watching them."""
        self.evaluate()
        self._thread = threading.Thread(target=self._watch, name="health", daemon=True)
        self._thread.start()

    def evaluate(self) -> str | None:
        """Check every condition now and publish the result; the problem found (None: none)."""
        problem = None
        for condition in self.conditions:
            try:
                problem = condition()
            except Exception as e:  # a check that breaks cannot vouch for the daemon
                problem = f"health check {getattr(condition, '__name__', condition)}: {e}"
            if problem:
                break
        with self._lock:
            self.evaluated = time.monotonic()
            if self._stop.is_set():
                return self.problem
            changed = problem != self.problem
            self.problem = problem
            self.servicer.set(OVERALL, SERVING if problem is None else NOT_SERVING)
            for name in ALL_SERVICES:
                if name in NEEDS_WORKERS:
                    self.servicer.set(name, SERVING if problem is None else NOT_SERVING)
                else:
                    self.servicer.set(name, SERVING)
        if changed:
            if problem is None:
                log.info("health: serving")
            else:
                log.error("health: not serving new sessions: %s", problem)
            for callback in self._on_change:
                callback(problem)
        return problem

    def stale_for(self, limit: float) -> str | None:
        """Why the monitor is not keeping up (None: it evaluated within ``limit`` seconds): a
        condition hung, so its answer cannot be trusted."""
        age = time.monotonic() - self.evaluated
        if self._thread is not None and age > limit:
            return f"the health monitor has not finished a check in {age:.0f} s"
        return None

    def shutting_down(self) -> None:
        """Every service NOT_SERVING, for good (later evaluations change nothing)."""
        with self._lock:
            self._stop.set()
            self.problem = "shutting down"
            self.servicer.enter_graceful_shutdown()
        log.info("health: not serving (shutting down)")
        if self._thread is not None:
            self._thread.join(timeout=self.period + 5)

    def _watch(self) -> None:
        while not self._stop.wait(self.period):
            self.evaluate()


def probe_server(target: str, timeout: float = 5.0) -> str | None:
    """Ask the daemon's own server for its overall health over ``target`` (a plain gRPC
    target): None when it answers, else why not. Whatever status it answers, it answered: a
    daemon that is up but cannot spawn workers is not wedged, and restarting it would not
    bring a lost GPU back."""
    from grpc_health.v1 import health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=OVERALL), timeout=timeout
            )
        except grpc.RpcError as e:
            return f"the daemon's own health check over {target} failed: {e.code().name}"
    return None
