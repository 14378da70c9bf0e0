"""The GPU half of a VM migration: one held migration per session of the domain.

Each session moves with ``hold`` and ``gate`` (``MigrateRequest``): pre-copy rounds run while
the VM runs, then the source worker waits for Stop before the final round, and after the
destination acknowledged that round it waits for Commit or Abort (the session frozen at the
source, ready but not serving at the destination). The VM side (:mod:`crane.vm.migrate`,
:mod:`crane.vm.watch`) decides when: Stop once libvirt paused the VM for its own switchover,
Commit once the VM runs at the destination, Abort when libvirt failed or was cancelled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from crane.v1 import control_pb2, control_pb2_grpc
from crane.wire.channel import open_channel

__all__ = ["GpuMove", "domain_sessions"]

#: Phases a session migration ends in.
OVER = ("done", "failed")


def domain_sessions(daemon: str, domain: str) -> list[Any]:
    """The sessions of ``domain`` that live on ``daemon`` (not those that left it)."""
    with open_channel(daemon) as ch:
        reply = control_pb2_grpc.ControlStub(ch).ListSessions(
            control_pb2.ListSessionsRequest(domain=domain), timeout=30
        )
    return [s for s in reply.sessions if s.state not in ("migrated", "closing", "closed")]


class GpuMove:
    """A held migration of session ``sid`` from ``daemon`` to ``to``, followed on a thread."""

    def __init__(
        self,
        daemon: str,
        sid: str,
        to: str,
        hold_timeout_s: float,
        accept_lower_limits: bool = False,
        on_progress: Callable[[GpuMove], None] | None = None,
    ) -> None:
        self.daemon, self.sid, self.to = daemon, sid, to
        self.last = control_pb2.MigrateProgress(phase="preflight")
        self.error = ""
        self.changed = threading.Condition()
        self.on_progress = on_progress
        self._req = control_pb2.MigrateRequest(
            session_id=sid,
            to=to,
            hold=True,
            gate=True,
            hold_timeout_s=hold_timeout_s,
            accept_lower_limits=accept_lower_limits,
        )
        self._thread = threading.Thread(target=self._follow, name=f"gpu-{sid}", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            with open_channel(self.daemon) as ch:
                for p in control_pb2_grpc.MigrationStub(ch).Migrate(self._req):
                    self._update(p)
        except grpc.RpcError as e:
            self._update(control_pb2.MigrateProgress(phase="failed", error=str(e.details())))
            return
        if self.last.phase not in OVER:  # the stream ended without an outcome
            self._update(
                control_pb2.MigrateProgress(phase="failed", error="the source daemon went away")
            )

    def _update(self, p: Any) -> None:
        with self.changed:
            self.last = p
            if p.phase == "failed":
                self.error = p.error
            self.changed.notify_all()
        if self.on_progress is not None:
            self.on_progress(self)

    @property
    def phase(self) -> str:
        return str(self.last.phase)

    @property
    def over(self) -> bool:
        return self.phase in OVER

    def wait_for(self, ok: Callable[[Any], bool], timeout: float) -> bool:
        """Wait until ``ok(progress)`` or the migration is over; whether ``ok`` held."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not ok(self.last) and self.phase not in OVER:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
            return bool(ok(self.last))

    def ready(self, timeout: float) -> bool:
        """Pre-copy converged and the gate waits for Stop (False: failed or too slow)."""
        return self.wait_for(lambda p: p.phase == "precopy" and p.awaiting, timeout)

    def held(self, timeout: float) -> bool:
        return self.wait_for(lambda p: p.phase == "held" and p.awaiting, timeout)

    def decide(self, verb: str) -> str:
        """Stop, Commit or Abort; "" when delivered, else why not."""
        with open_channel(self.daemon) as ch:
            stub = control_pb2_grpc.MigrationStub(ch)
            try:
                getattr(stub, verb)(control_pb2.MigrateDecision(session_id=self.sid), timeout=30)
            except grpc.RpcError as e:
                return str(e.details())
        return ""

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()
