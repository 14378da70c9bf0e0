"""systemd's notification protocol (``sd_notify(3)``) and its watchdog, for ``Type=notify``.

Each notification is one datagram of ``KEY=VALUE`` lines sent to the ``AF_UNIX`` socket named by
``$NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract namespace, where the ``@`` becomes a
NUL byte). With ``WatchdogSec=`` set, systemd passes ``$WATCHDOG_USEC`` (and ``$WATCHDOG_PID``,
the process meant: another pid means the variables were inherited and are not ours) and kills
and restarts the service when no ``WATCHDOG=1`` arrives within that time. Pinging from a timer
alone would keep a wedged daemon alive, so :class:`Watchdog` pings only when a liveness probe
(craned's: its own gRPC server answers a health check, its worker spawner runs) passes, at half
the interval as ``sd_watchdog_enabled(3)`` recommends.

The protocol is a few lines of socket code, kept here rather than taken from a package: the
Python ones in circulation either lack the abstract namespace or the watchdog variables.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping

__all__ = ["Notifier", "Watchdog", "watchdog_interval"]

log = logging.getLogger("craned")


def _address(value: str) -> str | None:
    """The socket address ``$NOTIFY_SOCKET`` names (None: one this process cannot use)."""
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None  # e.g. systemd's vsock:CID:PORT form, which a host daemon never gets


class Notifier:
    """Sends notifications to the service manager; every method is a no-op when the process
    was not started with ``$NOTIFY_SOCKET`` (a foreground run, a test)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET", "")
        self.address = _address(raw) if raw else None
        if raw and self.address is None:
            log.warning("NOTIFY_SOCKET=%s: not a unix socket address; not notifying", raw)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *lines: str) -> bool:
        """Send ``lines`` as one datagram (True: sent). A failure is logged, never raised:
        the daemon serves whether or not its manager listens."""
        if self.address is None:
            return False
        payload = "\n".join(lines).encode()
        with self._lock:
            try:
                if self._sock is None:
                    kind = socket.SOCK_DGRAM | socket.SOCK_CLOEXEC
                    self._sock = socket.socket(socket.AF_UNIX, kind)
                self._sock.sendto(payload, self.address)
                return True
            except OSError as e:
                log.warning("sd_notify(%s) failed: %s", " ".join(lines), e)
                return False

    def ready(self, status: str) -> bool:
        """READY=1 with the main pid (so a manager told of a wrapper still knows ours)."""
        return self.send("READY=1", f"MAINPID={os.getpid()}", f"STATUS={status}")

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def stopping(self, status: str) -> bool:
        return self.send("STOPPING=1", f"STATUS={status}")

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between pings the manager asks of this process (half of ``$WATCHDOG_USEC``),
    None when it asks none (unset, zero, malformed, or meant for another pid)."""
    env = os.environ if environ is None else environ
    try:
        usec = int(env.get("WATCHDOG_USEC", "0"))
    except ValueError:
        return None
    pid = env.get("WATCHDOG_PID", "")
    if usec <= 0 or (pid and pid != str(os.getpid())):
        return None
    return usec / 2e6


class Watchdog:
    """Pings ``WATCHDOG=1`` every ``interval`` seconds while ``probe()`` says the daemon is
    alive (returns None); when it says why not, the pings stop (systemd restarts the daemon once
    its ``WatchdogSec`` passes) and the reason goes to the log and to ``STATUS=``."""

    def __init__(
        self, notifier: Notifier, interval: float, probe: Callable[[], str | None]
    ) -> None:
        self.notifier = notifier
        self.interval = interval
        self.probe = probe
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sd-watchdog", daemon=True)

    def start(self) -> None:
        log.info("systemd watchdog: pinging every %.1f s while healthy", self.interval)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval + 10)

    def _run(self) -> None:
        failing: str | None = None
        while not self._stop.is_set():
            try:
                why = self.probe()
            except Exception as e:  # a probe that raises has found the daemon unwell too
                why = f"health probe failed: {e}"
            if self._stop.is_set():
                return
            if why is None:
                self.notifier.send("WATCHDOG=1")
                if failing is not None:
                    log.info("healthy again; watchdog pings resumed")
                    self.notifier.status("serving")
            elif why != failing:
                log.error("unhealthy, watchdog pings withheld: %s", why)
                self.notifier.status(f"unhealthy: {why}")
            failing = why
            self._stop.wait(self.interval)
