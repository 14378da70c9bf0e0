"""``crane migrate DOMAIN --to DEST_URI``: a libvirt live migration that moves the GPU state too.

Order (why: the GPU state must add as little as possible to the VM's downtime, and nothing may
be lost or repeated whichever side fails):

1. Pre-flight. libvirt's side: the domain runs, has no host device (a passed-through device
   does not migrate), is a Crane guest (its metadata names its daemon). Crane's side: the
   destination daemon attaches the domain (AttachDomain, so its socket exists before libvirt
   starts the incoming QEMU whose guest forward dials it) and every session of the domain is
   pre-flighted against it (the held migration's first step). Any refusal: nothing moved, the
   VM never noticed.
2. GPU pre-copy while the VM and its program run, each session with ``hold`` and ``gate``:
   rounds until the dirty set converges, then the source worker waits for Stop.
3. libvirt's live migration (``migrateToURI3``, LIVE | PEER2PEER) on a thread, followed through
   events: MIGRATION_ITERATION (VM memory rounds), SUSPENDED_MIGRATED on the source (the VM is
   paused for its own stop-and-copy).
4. At SUSPENDED_MIGRATED: Stop. The guest cannot issue calls any more, so the GPU's final round
   runs in parallel with QEMU's final copy and the destination's resume, not before them: the
   GPU adds nothing to the VM's downtime, and the program's visible pause is the VM's downtime
   plus the GPU final round's excess over it plus one reconnect. A guest that reconnects to the
   destination before the commit is told to retry (``crane-parked``), so it waits there.
5. libvirt succeeded (the VM runs at the destination): Commit each held session (the destination
   serves it, the source releases it), then the source daemon detaches the domain. libvirt
   failed or was cancelled (``dom.abortJob()`` on Ctrl-C or ``--timeout``): Abort each (dropped
   at the destination, thawed at the source, where the VM still runs), and the destination
   detaches the domain if this migration attached it.

The result and every progress event are dicts (``--json`` prints one object per line).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from crane.v1 import control_pb2, control_pb2_grpc
from crane.vm.domain import crane_meta, retarget
from crane.vm.events import EventQueue, ensure_event_loop, libvirt_module
from crane.vm.gpu import GpuMove, domain_sessions
from crane.wire.channel import open_channel

__all__ = ["MigrationRefused", "VmMigration", "VmMigrationFailed", "attach_domain", "detach_domain"]

Report = Callable[[dict[str, Any]], None]


class MigrationRefused(Exception):
    """Pre-flight said no; nothing moved (the VM and its sessions run where they were)."""


class VmMigrationFailed(Exception):
    """libvirt failed or was cancelled; rolled back (the VM runs on the source)."""


def attach_domain(daemon: str, domain: str, tenant: str = "") -> tuple[str, bool]:
    """Have ``daemon`` serve ``domain``'s socket; (its path, whether it was attached already)."""
    with open_channel(daemon) as ch:
        r = control_pb2_grpc.ControlStub(ch).AttachDomain(
            control_pb2.AttachDomainRequest(domain=domain, tenant=tenant), timeout=30
        )
    return str(r.path), bool(r.already)


def detach_domain(daemon: str, domain: str) -> None:
    with open_channel(daemon) as ch:
        control_pb2_grpc.ControlStub(ch).DetachDomain(
            control_pb2.DetachDomainRequest(domain=domain), timeout=30
        )


@dataclass
class VmMigration:
    """One ``crane migrate DOMAIN``: run :meth:`run`; :meth:`cancel` from another thread."""

    domain: str
    source_uri: str
    dest_uri: str
    dest_daemon: str
    source_daemon: str = ""  # "": the one the domain's metadata names
    migrate_uri: str = ""  # libvirt's data connection (e.g. tcp://HOST); "": libvirt's choice
    listen_address: str = ""
    timeout_s: float = 0.0  # cancel (roll back) after this long; 0: no limit
    hold_timeout_s: float = 120.0
    precopy_wait_s: float = 120.0
    accept_lower_limits: bool = False
    report: Report = field(default=lambda _e: None)
    _cancel: threading.Event = field(default_factory=threading.Event)
    _cancel_why: str = ""
    _moves: list[GpuMove] = field(default_factory=list)
    _committed: bool = False
    _failures: list[str] = field(default_factory=list)
    vm: dict[str, Any] = field(default_factory=dict)  # what libvirt said of the VM's migration

    def cancel(self, why: str = "cancelled") -> None:
        self._cancel_why = why
        self._cancel.set()

    # ---- the steps -----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        t0 = time.monotonic()
        libvirt = libvirt_module()
        ensure_event_loop()
        src = libvirt.open(self.source_uri)
        dst = None
        try:
            dom = src.lookupByName(self.domain)
            xml = self._libvirt_preflight(dom)
            meta = crane_meta(xml)
            daemon = self.source_daemon or (meta.daemon if meta else "")
            try:
                dst = libvirt.open(self.dest_uri)
            except libvirt.libvirtError as e:
                raise MigrationRefused(f"destination {self.dest_uri}: {e}") from None
            sessions = domain_sessions(daemon, self.domain) if daemon else []
            dest_xml, attached_here = self._attach(xml, meta)
            moves = self._gpu_precopy(daemon, sessions, attached_here)
            return self._switch(libvirt, src, dst, dom, dest_xml, moves, daemon, attached_here, t0)
        finally:
            for c in (src, dst):
                if c is not None:
                    c.close()

    def _libvirt_preflight(self, dom: Any) -> str:
        libvirt = libvirt_module()
        if not dom.isActive():
            raise MigrationRefused(f"domain {self.domain} is not running")
        xml = str(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_MIGRATABLE))
        if re.search(r"<hostdev\b", xml):
            raise MigrationRefused(f"domain {self.domain} has a host device: it cannot migrate")
        self.report({"event": "preflight", "domain": self.domain, "persistent": dom.isPersistent()})
        return xml

    def _attach(self, xml: str, meta: Any) -> tuple[str, bool]:
        """The destination daemon serves the domain's socket; the XML the destination starts."""
        if meta is None:
            return xml, False
        try:
            path, already = attach_domain(self.dest_daemon, self.domain)
        except grpc.RpcError as e:
            raise MigrationRefused(
                f"destination daemon {self.dest_daemon} cannot take domain {self.domain}: "
                f"{e.code().name}: {e.details()}"
            ) from None
        return retarget(xml, path, self.dest_daemon), not already

    def _gpu_precopy(self, daemon: str, sessions: list[Any], attached: bool) -> list[GpuMove]:
        moves = [
            GpuMove(
                daemon,
                s.id,
                self.dest_daemon,
                self.hold_timeout_s,
                self.accept_lower_limits,
                on_progress=lambda _m: self._progress("gpu"),
            )
            for s in sessions
        ]
        self._moves = moves
        deadline = time.monotonic() + self.precopy_wait_s
        for m in moves:
            m.ready(max(deadline - time.monotonic(), 0.0))
        bad = [m for m in moves if m.phase != "precopy" or self._cancel.is_set()]
        if bad:
            self._abort_all(moves)
            if attached:
                self._detach(self.dest_daemon)
            if self._cancel.is_set():
                raise VmMigrationFailed(f"{self._cancel_why} during the GPU pre-copy: rolled back")
            why = "; ".join(
                f"session {m.sid}: {m.error or 'pre-copy did not converge'}" for m in bad
            )
            raise MigrationRefused(why)
        return moves

    def _switch(
        self,
        libvirt: Any,
        src: Any,
        dst: Any,
        dom: Any,
        dest_xml: str,
        moves: list[GpuMove],
        daemon: str,
        attached: bool,
        t0: float,
    ) -> dict[str, Any]:
        events = EventQueue()
        events.follow(src, "source", dom)
        events.follow(dst, "destination")
        params = {libvirt.VIR_MIGRATE_PARAM_DEST_XML: dest_xml}
        if self.migrate_uri:
            params[libvirt.VIR_MIGRATE_PARAM_URI] = self.migrate_uri
        if self.listen_address:
            params[libvirt.VIR_MIGRATE_PARAM_LISTEN_ADDRESS] = self.listen_address
        flags = libvirt.VIR_MIGRATE_LIVE | libvirt.VIR_MIGRATE_PEER2PEER
        if dom.isPersistent():
            flags |= libvirt.VIR_MIGRATE_PERSIST_DEST | libvirt.VIR_MIGRATE_UNDEFINE_SOURCE
        outcome: dict[str, Any] = {}

        def migrate() -> None:
            try:
                dom.migrateToURI3(self.dest_uri, params, flags)
                outcome["ok"] = True
            except libvirt.libvirtError as e:
                outcome["error"] = str(e)

        t_start = time.monotonic()
        thread = threading.Thread(target=migrate, name="libvirt-migrate", daemon=True)
        thread.start()
        self.vm = {"iteration": 0}
        times: dict[str, float] = {}
        deadline = t_start + self.timeout_s if self.timeout_s else None
        aborting = False
        try:
            while thread.is_alive() or not events.q.empty():
                if not aborting and (
                    self._cancel.is_set() or (deadline and time.monotonic() > deadline)
                ):
                    aborting = True
                    self._cancel_why = self._cancel_why or f"timed out after {self.timeout_s:g} s"
                    self.report({"event": "cancel", "why": self._cancel_why})
                    try:
                        dom.abortJob()
                    except libvirt.libvirtError as e:  # no job (yet, or any more)
                        self.report({"event": "cancel", "why": f"abortJob: {e}"})
                ev = events.get(0.25)
                if ev is None:
                    self._vm_stats(dom)
                    self._progress("tick")
                    continue
                self._on_event(libvirt, ev, dom, moves, times)
            thread.join()
        finally:
            events.close()
        total = time.monotonic() - t0
        if "ok" not in outcome:
            self._abort_all(moves)
            if attached:
                self._detach(self.dest_daemon)
            why = self._cancel_why or outcome.get("error", "libvirt failed")
            raise VmMigrationFailed(
                f"libvirt migration of {self.domain} failed ({why}); rolled back: the VM and its "
                "GPU state stay on the source"
            )
        failures = self._failures if self._committed else self._commit_all(moves)
        if daemon and not failures:
            self._detach(daemon)  # the VM left: no new connection from it will come here
        result = {
            "event": "done" if not failures else "failed",
            "domain": self.domain,
            "total_s": round(total, 4),
            "libvirt_s": round(times.get("vm-done", time.monotonic()) - t_start, 4),
            "vm_downtime_s": self.vm.get("downtime_s"),
            "vm_events_downtime_s": _gap(times, "suspended", "resumed"),
            "sessions": [_gpu_row(m) for m in moves],
        }
        if failures:
            result["error"] = "; ".join(failures)
        self.report(result)
        return result

    def _on_event(
        self, libvirt: Any, ev: Any, dom: Any, moves: list[GpuMove], times: dict[str, float]
    ) -> None:
        if ev.domain != self.domain:
            return
        if ev.kind == "iteration":
            self.vm["iteration"] = ev.iteration
            self._vm_stats(dom)
            self._progress("vm-iteration")
        elif ev.kind == "job-completed":
            self.vm["downtime_s"] = ev.stats.get("downtime", 0) / 1e3
            self.vm["memory_processed"] = ev.stats.get("memory_processed")
            self.vm["memory_total"] = ev.stats.get("memory_total")
            times["vm-done"] = ev.at
            self._progress("vm-completed")
        elif ev.kind == "lifecycle":
            migrated = {
                libvirt.VIR_DOMAIN_EVENT_SUSPENDED: libvirt.VIR_DOMAIN_EVENT_SUSPENDED_MIGRATED,
                libvirt.VIR_DOMAIN_EVENT_RESUMED: libvirt.VIR_DOMAIN_EVENT_RESUMED_MIGRATED,
                libvirt.VIR_DOMAIN_EVENT_STOPPED: libvirt.VIR_DOMAIN_EVENT_STOPPED_MIGRATED,
            }
            if migrated.get(ev.event) != ev.detail:
                return
            if ev.event == libvirt.VIR_DOMAIN_EVENT_SUSPENDED and ev.side == "source":
                times["suspended"] = ev.at
                for m in moves:  # the guest cannot call any more: the GPU's final rounds go now
                    m.decide("Stop")
                self._progress("vm-suspended")
            elif ev.event == libvirt.VIR_DOMAIN_EVENT_RESUMED:
                times["resumed" if ev.side == "destination" else "source-resumed"] = ev.at
                self._progress(f"vm-resumed-{ev.side}")
                if ev.side == "destination" and not self._committed:
                    # the VM runs there: no way back for it (libvirt's confirm step, which
                    # returns seconds later, only tidies the source), so serve its sessions
                    # there now rather than when migrateToURI3 returns
                    self._committed = True
                    self._failures = self._commit_all(moves)
            elif ev.event == libvirt.VIR_DOMAIN_EVENT_STOPPED and ev.side == "source":
                times["vm-done"] = times.get("vm-done", ev.at)
                self._progress("vm-left-source")

    def _vm_stats(self, dom: Any) -> None:
        try:
            st = dom.jobStats()
        except Exception:  # the job ended, or the domain left this host
            return
        for k in ("memory_processed", "memory_total", "memory_remaining", "memory_dirty_rate"):
            if k in st:
                self.vm[k] = st[k]

    def _commit_all(self, moves: list[GpuMove]) -> list[str]:
        """The VM runs at the destination: let every session be served there."""
        failures = []
        for m in moves:
            if not m.held(self.hold_timeout_s):
                failures.append(f"session {m.sid}: {m.error or 'never held'}")
                continue
            why = m.decide("Commit")
            if why or not m.wait_for(lambda p: p.phase == "done", 60):
                failures.append(f"session {m.sid}: {why or m.error}")
            self._progress("gpu-committed")
        return failures

    def _abort_all(self, moves: list[GpuMove]) -> None:
        for m in moves:
            if not m.over:
                m.decide("Abort")
        for m in moves:
            m.wait_for(lambda _p: False, 60)  # until over
            self._progress("gpu-aborted")

    def _detach(self, daemon: str) -> None:
        try:
            detach_domain(daemon, self.domain)
        except grpc.RpcError as e:
            self.report({"event": "warning", "detach": daemon, "error": str(e.details())})

    def _progress(self, what: str) -> None:
        moves, vm = self._moves, dict(self.vm)
        gpu_rate = max((m.last.rate for m in moves), default=0.0)
        self.report(
            {
                "event": what,
                "vm": vm,
                "sessions": [_gpu_row(m) for m in moves],
                "gpu_memory_bytes": sum(m.last.memory_bytes for m in moves),
                "gpu_session_bytes": sum(m.last.session_bytes for m in moves),
                "gpu_rate": gpu_rate,
                "expected_gpu_downtime_s": max((m.last.est_downtime for m in moves), default=0.0),
            }
        )


def _gpu_row(m: GpuMove) -> dict[str, Any]:
    p = m.last
    row: dict[str, Any] = {
        "session": m.sid,
        "phase": p.phase,
        "round": p.round,
        "memory_bytes": p.memory_bytes,
        "session_bytes": p.session_bytes,
        "awaiting": p.awaiting,
    }
    if p.phase == "done":
        row.update(downtime_s=p.downtime, switchover_s=p.switchover, total_s=p.total)
    if p.error:
        row["error"] = p.error
    return row


def _gap(times: dict[str, float], a: str, b: str) -> float | None:
    if a in times and b in times:
        return round(times[b] - times[a], 4)
    return None
