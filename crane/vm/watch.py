"""``crane libvirt-watch --uri URI``: the helper the libvirt hook needs, one per host.

The hook (:mod:`crane.vm.hook`) starts held, gated GPU migrations when a Crane guest's VM is
about to migrate, but it must not call libvirt, and it cannot see what happens after it
returns. This long-running process follows this host's libvirt events and gives each held
migration of the domain's sessions on this host's daemon its decision, exactly as ``crane
migrate DOMAIN`` (:mod:`crane.vm.migrate`) does:

* SUSPENDED_MIGRATED (the VM paused here for its stop-and-copy): Stop, so the GPU's final round
  runs in parallel with QEMU's.
* STOPPED_MIGRATED (the VM runs at the destination now): Commit once held.
* RESUMED_MIGRATED here (libvirt failed after pausing and resumed the VM here): Abort.

A libvirt failure before the VM paused gives no event here; the held migration's deadline
aborts it then (the guest ran on throughout: a gated migration freezes nothing before Stop).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from crane.v1 import control_pb2, control_pb2_grpc
from crane.vm.events import EventQueue, ensure_event_loop, libvirt_module
from crane.vm.gpu import domain_sessions
from crane.wire.channel import open_channel

__all__ = ["Watcher", "decide"]

#: How long a Commit is retried while the session's final round is still on its way.
COMMIT_WAIT_S = 120.0


def decide(daemon: str, sid: str, verb: str) -> str:
    """Deliver Stop / Commit / Abort; "" when delivered, else why not."""
    with open_channel(daemon) as ch:
        try:
            getattr(control_pb2_grpc.MigrationStub(ch), verb)(
                control_pb2.MigrateDecision(session_id=sid), timeout=30
            )
        except grpc.RpcError as e:
            return str(e.details())
    return ""


class Watcher:
    """Follows ``uri``'s domains and decides for the held migrations on ``daemon``."""

    def __init__(self, uri: str, daemon: str, log: Callable[[dict[str, Any]], None]) -> None:
        self.uri, self.daemon, self.log = uri, daemon, log
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self, ready: threading.Event | None = None) -> None:
        libvirt = libvirt_module()
        ensure_event_loop()
        conn = libvirt.open(self.uri)
        events = EventQueue()
        try:
            events.follow(conn, "source")
            if ready is not None:
                ready.set()
            while not self._stop.is_set():
                ev = events.get(0.5)
                if ev is None or ev.kind != "lifecycle":
                    continue
                verb = self._verb(libvirt, ev)
                if verb:
                    threading.Thread(
                        target=self._decide_all, args=(ev.domain, verb), daemon=True
                    ).start()
        finally:
            events.close()
            conn.close()

    @staticmethod
    def _verb(libvirt: Any, ev: Any) -> str:
        pairs = {
            (
                libvirt.VIR_DOMAIN_EVENT_SUSPENDED,
                libvirt.VIR_DOMAIN_EVENT_SUSPENDED_MIGRATED,
            ): "Stop",
            (libvirt.VIR_DOMAIN_EVENT_STOPPED, libvirt.VIR_DOMAIN_EVENT_STOPPED_MIGRATED): "Commit",
            (libvirt.VIR_DOMAIN_EVENT_RESUMED, libvirt.VIR_DOMAIN_EVENT_RESUMED_MIGRATED): "Abort",
        }
        return pairs.get((ev.event, ev.detail), "")

    def _decide_all(self, domain: str, verb: str) -> None:
        try:
            sessions = [s for s in domain_sessions(self.daemon, domain) if s.state == "migrating"]
        except grpc.RpcError as e:
            self.log({"event": "error", "domain": domain, "error": str(e.details())})
            return
        for s in sessions:
            why = decide(self.daemon, s.id, verb)
            deadline = time.monotonic() + COMMIT_WAIT_S
            # a Commit may come while the final round is still on its way: retry until held
            while verb == "Commit" and why and "cannot be committed now" in why:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
                why = decide(self.daemon, s.id, verb)
            self.log({"event": verb.lower(), "domain": domain, "session": s.id, "error": why})
