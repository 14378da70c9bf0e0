"""libvirt's events, delivered to a queue: the phases of a VM migration as libvirt sees them.

libvirt-python dispatches events only from an event loop the process runs; the default one
(``virEventRegisterDefaultImpl``) must be registered before the first connection is opened and
then run on a thread of its own. Callbacks only queue what they saw (they run on that thread and
must not block it); whoever follows the migration reads the queue.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Event", "EventQueue", "ensure_event_loop", "libvirt_module"]

_LOOP_LOCK = threading.Lock()
_LOOP_STARTED = False


def libvirt_module() -> Any:
    """The libvirt binding, or an ImportError naming the package to install."""
    try:
        import libvirt
    except ImportError:
        raise ImportError(
            "VM migration needs libvirt-python (pip install 'crane[vm]' or libvirt-python)"
        ) from None
    return libvirt


def ensure_event_loop() -> None:
    """Register libvirt's default event loop and run it on a daemon thread (once)."""
    global _LOOP_STARTED
    libvirt = libvirt_module()
    with _LOOP_LOCK:
        if _LOOP_STARTED:
            return
        libvirt.virEventRegisterDefaultImpl()

        def run() -> None:
            while True:
                libvirt.virEventRunDefaultImpl()

        threading.Thread(target=run, name="libvirt-events", daemon=True).start()
        _LOOP_STARTED = True


@dataclass
class Event:
    """One event: which side (``"source"``/``"destination"``), what, and when (monotonic)."""

    side: str
    kind: str  # "lifecycle", "iteration", "job-completed"
    domain: str
    event: int = 0
    detail: int = 0
    iteration: int = 0
    stats: dict[str, Any] = field(default_factory=dict)
    at: float = field(default_factory=time.monotonic)


class EventQueue:
    """Lifecycle, migration-iteration and job-completed events of some connections."""

    def __init__(self) -> None:
        self.q: queue.Queue[Event] = queue.Queue()
        self._ids: list[tuple[Any, int]] = []

    def follow(self, conn: Any, side: str, dom: Any | None = None) -> None:
        """Events of ``dom`` (every domain when None) on ``conn``, tagged ``side``."""
        libvirt = libvirt_module()

        def life(_c: Any, d: Any, event: int, detail: int, _o: Any) -> None:
            self.q.put(Event(side, "lifecycle", d.name(), event=event, detail=detail))

        def iteration(_c: Any, d: Any, n: int, _o: Any) -> None:
            self.q.put(Event(side, "iteration", d.name(), iteration=n))

        def completed(_c: Any, d: Any, params: dict[str, Any], _o: Any) -> None:
            self.q.put(Event(side, "job-completed", d.name(), stats=dict(params)))

        for eid, cb in (
            (libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, life),
            (libvirt.VIR_DOMAIN_EVENT_ID_MIGRATION_ITERATION, iteration),
            (libvirt.VIR_DOMAIN_EVENT_ID_JOB_COMPLETED, completed),
        ):
            self._ids.append((conn, conn.domainEventRegisterAny(dom, eid, cb, None)))

    def get(self, timeout: float) -> Event | None:
        try:
            return self.q.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None

    def close(self) -> None:
        for conn, cid in self._ids:
            with contextlib.suppress(Exception):
                conn.domainEventDeregisterAny(cid)
        self._ids.clear()
