"""What the daemon keeps of its sessions' accounting beyond their workers' lives.

A live session's counters are its worker's snapshot (crane.host.stats.SnapshotFile); when its
worker goes (the session ended, parked, moved away) its last snapshot is folded into its
tenant's totals here, so a tenant's ``_total`` counters never go backwards in Prometheus. The
daemon's own operations on sessions (checkpoints, restores, migrations) are counted and timed
here as they end.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from crane.engine.meter import COPY_KINDS, HIST_BUCKETS

__all__ = ["OPERATION_BUCKETS_S", "Accounting", "OperationStats", "Totals", "add_snapshot"]

#: Histogram buckets (seconds) of checkpoint, restore and migration durations.
OPERATION_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


@dataclass
class Totals:
    """Counters summed over sessions (a tenant's ended sessions, or a scrape's sum)."""

    calls: dict[str, list[Any]] = field(default_factory=dict)  # op -> [count, ns, hist]
    launches: int = 0
    kernel_ns: int = 0
    copy_ns: int = 0
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COPY_KINDS, 0))


def add_snapshot(t: Totals, snap: dict[str, Any]) -> None:
    """Add a worker's snapshot (crane.engine.meter.Meter.snapshot) to ``t``."""
    for op, (n, ns, hist) in snap.get("calls", {}).items():
        mine = t.calls.get(op)
        if mine is None:
            t.calls[op] = [n, ns, list(hist)]
        else:
            mine[0] += n
            mine[1] += ns
            mine[2] = [a + b for a, b in zip(mine[2], hist, strict=False)]
            if len(mine[2]) < HIST_BUCKETS:
                mine[2] += [0] * (HIST_BUCKETS - len(mine[2]))
    t.launches += snap.get("launches", 0)
    t.kernel_ns += snap.get("kernel_ns", 0)
    t.copy_ns += snap.get("copy_ns", 0)
    for k, v in snap.get("bytes", {}).items():
        t.bytes[k] = t.bytes.get(k, 0) + v


@dataclass
class OperationStats:
    """One kind of operation for one tenant: how many ended how, and their durations."""

    results: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    seconds: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * len(OPERATION_BUCKETS_S))
    count: int = 0

    def add(self, ok: bool, seconds: float) -> None:
        self.results["ok" if ok else "error"] += 1
        self.count += 1
        self.seconds += seconds
        for i, le in enumerate(OPERATION_BUCKETS_S):
            if seconds <= le:
                self.buckets[i] += 1


class Accounting:
    """The daemon's book (thread-safe: services and reapers write, the exporter reads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ended: dict[str, Totals] = defaultdict(Totals)  # tenant -> its ended sessions
        #: (operation, tenant) -> stats; operation: checkpoint, restore, migration
        self.operations: dict[tuple[str, str], OperationStats] = defaultdict(OperationStats)
        self._migrating: dict[str, float] = {}  # session -> time.monotonic() it started

    def retire(self, tenant: str, snap: dict[str, Any] | None) -> None:
        """A session's worker is gone: keep its last counts in its tenant's totals."""
        if snap is None:
            return
        with self.lock:
            add_snapshot(self.ended[tenant], snap)

    def operation(self, what: str, tenant: str, ok: bool, seconds: float) -> None:
        with self.lock:
            self.operations[(what, tenant)].add(ok, seconds)

    def migration_started(self, sid: str, now: float) -> None:
        with self.lock:
            self._migrating[sid] = now

    def migration_over(self, sid: str, tenant: str, ok: bool, now: float) -> None:
        """The migration of ``sid`` ended (once per migration: a second call finds none)."""
        with self.lock:
            since = self._migrating.pop(sid, None)
            if since is not None:
                self.operations[("migration", tenant)].add(ok, now - since)

    def view(self) -> tuple[dict[str, Totals], dict[tuple[str, str], OperationStats]]:
        """Copies for one scrape."""
        with self.lock:
            ended = {}
            for tenant, t in self.ended.items():
                c = Totals()
                add_snapshot(c, _as_snapshot(t))
                ended[tenant] = c
            ops = {
                k: OperationStats(dict(v.results), v.seconds, list(v.buckets), v.count)
                for k, v in self.operations.items()
            }
        return ended, ops


def _as_snapshot(t: Totals) -> dict[str, Any]:
    return {
        "calls": t.calls,
        "launches": t.launches,
        "kernel_ns": t.kernel_ns,
        "copy_ns": t.copy_ns,
        "bytes": t.bytes,
    }
