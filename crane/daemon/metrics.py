"""The Prometheus exporter: per GPU in DCGM exporter's names and units, per session and per
tenant under ``crane_``.

A custom collector reads, at scrape time, what the workers already published (their stats
pages and accounting snapshots, crane.host.stats) and the daemon's own book
(crane.daemon.accounting): the call path pays nothing for a scrape, and a scrape never asks a
worker (one inside a long kernel included).

Labels: ``gpu`` (the board's NVML index on GPU hosts, the daemon's device index on the
simulator), ``UUID`` and ``pci_bus_id`` as DCGM exporter writes them (so the two join),
``modelName``; per session also ``session``, ``tenant`` and ``domain`` (the libvirt domain
whose guest opened it, "" for none).

What the simulator cannot give is not exported for its devices (no value is invented):
power (``DCGM_FI_DEV_POWER_USAGE``), temperature (``DCGM_FI_DEV_GPU_TEMP``) and XID errors
(``DCGM_FI_DEV_XID_ERRORS``). Its ``DCGM_FI_DEV_GPU_UTIL`` is the share of the profile window
its sessions' kernels ran (the simulator runs one kernel at a time per session); its
``FB_USED``/``FB_FREE`` come from the device ledger that ``cuMemGetInfo`` answers from.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from crane.daemon.accounting import OPERATION_BUCKETS_S, Totals, add_snapshot
from crane.daemon.devices import Device
from crane.daemon.gpu_inventory import NvmlUnavailable, XidWatcher, gpu_telemetry
from crane.daemon.lifecycle import SessionState
from crane.daemon.session import DaemonSession
from crane.daemon.sessions import SessionManager
from crane.engine.meter import COPY_KINDS, HIST_BUCKETS, bucket_upper_s
from crane.host.stats import WORKER_MODES, SnapshotFile, snapshot_path

__all__ = ["MetricsCollector", "parse_listen", "start_exporter"]

log = logging.getLogger("craned")

#: Call latency buckets exported: 2**10 ns (~1 us) .. 2**35 ns (~34 s); shorter calls fall in
#: the first, longer in +Inf.
_FIRST_BUCKET, _LAST_BUCKET = 10, 35
_GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "modelName")
_SESSION_LABELS = ("session", "tenant", "domain", *_GPU_LABELS)


@dataclass
class _Live:
    """One session at scrape time."""

    session: DaemonSession
    gpu: tuple[str, ...]
    snap: dict[str, Any] | None
    calls: int
    mem_used: int
    state: str


class MetricsCollector(Collector):
    def __init__(self, sessions: SessionManager) -> None:
        self.sessions = sessions
        cuda = [int(d.arg) for d in sessions.devices if d.backend == "cuda"]
        self.xids = XidWatcher(cuda) if cuda else None
        self._pci: dict[int, str] = {}

    # ---- per GPU -------------------------------------------------------------------------
    def _gpu_labels(self, d: Device) -> tuple[str, ...]:
        if d.backend != "cuda":
            return (str(d.index), d.uuid, "", d.name)
        i = int(d.arg)
        if i not in self._pci:
            try:
                self._pci[i] = gpu_telemetry(i).pci_bus_id
            except NvmlUnavailable:
                self._pci[i] = ""
        return (str(i), d.uuid, self._pci[i], d.name)

    def _gpus(self, live: list[_Live]) -> Iterator[Metric]:
        util = GaugeMetricFamily(
            "DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", labels=_GPU_LABELS
        )
        used = GaugeMetricFamily(
            "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels=_GPU_LABELS
        )
        free = GaugeMetricFamily(
            "DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=_GPU_LABELS
        )
        power = GaugeMetricFamily(
            "DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", labels=_GPU_LABELS
        )
        temp = GaugeMetricFamily(
            "DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", labels=_GPU_LABELS
        )
        xid = GaugeMetricFamily(
            "DCGM_FI_DEV_XID_ERRORS",
            "Value of the last XID error encountered.",
            labels=_GPU_LABELS,
        )
        for d in self.sessions.devices:
            labels = self._gpu_labels(d)
            if d.backend == "cuda":
                try:
                    t = gpu_telemetry(int(d.arg))
                except NvmlUnavailable:
                    continue
                for fam, v in (
                    (util, t.utilization_pct),
                    (used, t.fb_used_mib),
                    (free, t.fb_free_mib),
                    (power, t.power_w),
                    (temp, t.temp_c),
                ):
                    if v is not None:
                        fam.add_metric(labels, v)
                if self.xids is not None and not self.xids.error:
                    xid.add_metric(labels, self.xids.last.get(int(d.arg), 0))
                continue
            mine = [s for s in live if s.session.device is d]
            in_use = d.ledger.used()
            used.add_metric(labels, in_use / 2**20)
            free.add_metric(labels, max(d.total_mem - in_use, 0) / 2**20)
            busy = 0.0
            for s in mine:
                p = (s.snap or {}).get("profile")
                if p:
                    busy += p["kernel_ns"] / p["span_ns"]
            util.add_metric(labels, round(min(busy, 1.0) * 100))
        # a field no device gives (the simulator's power, temperature, XIDs) is left out whole
        yield from (f for f in (util, used, free, power, temp, xid) if f.samples)

    # ---- per session and tenant ----------------------------------------------------------
    def _live(self) -> list[_Live]:
        out = []
        for s in self.sessions.list():
            try:
                calls, mem, _, mode, _ = s.stats.read()
            except ValueError:  # released under us
                continue
            state = s.state
            if mode in WORKER_MODES and state is SessionState.READY:
                state = SessionState.RUNNING  # as crane ps shows it (crane.daemon.render)
            snap = None
            if state is not SessionState.PARKED:
                snap = SnapshotFile(snapshot_path(s.stats_path)).read()
            out.append(_Live(s, self._gpu_labels(s.device), snap, calls, mem, state.value))
        return out

    def collect(self) -> Iterator[Metric]:
        live = self._live()
        yield from self._gpus(live)
        yield from self._sessions(live)
        yield from self._tenants(live)
        yield from self._operations()

    def _sessions(self, live: list[_Live]) -> Iterator[Metric]:
        L = _SESSION_LABELS
        calls = CounterMetricFamily(
            "crane_session_calls",
            "Driver calls the session's worker ran, by op.",
            labels=(*L, "op"),
        )
        latency = HistogramMetricFamily(
            "crane_session_call_duration_seconds",
            "Time the worker spent executing a call, by op.",
            labels=(*L, "op"),
        )
        launches = CounterMetricFamily(
            "crane_session_kernel_launches", "Kernel launches.", labels=L
        )
        busy = CounterMetricFamily(
            "crane_session_gpu_busy_seconds",
            "GPU time in the session's kernels, copies and memsets.",
            labels=L,
        )
        kernel = CounterMetricFamily(
            "crane_session_kernel_seconds", "GPU time in the session's kernels.", labels=L
        )
        copied = CounterMetricFamily(
            "crane_session_copy_bytes",
            "Bytes copied, by direction (h2d, d2h, d2d).",
            labels=(*L, "direction"),
        )
        memory = GaugeMetricFamily(
            "crane_session_memory_used_bytes", "Device memory the session holds.", labels=L
        )
        for s in live:
            labels = (s.session.id, s.session.tenant, s.session.domain, *s.gpu)
            memory.add_metric(labels, s.mem_used)
            if s.snap is None:
                continue
            _add_totals(calls, latency, launches, busy, kernel, copied, labels, _totals(s.snap))
        yield from (calls, latency, launches, busy, kernel, copied, memory)

    def _tenants(self, live: list[_Live]) -> Iterator[Metric]:
        ended, _ = self.sessions.book.view()
        totals: dict[str, Totals] = {}
        for tenant, t in ended.items():
            totals[tenant] = t
        memory: dict[str, int] = {}
        states: dict[tuple[str, str], int] = {}
        for s in live:
            tenant = s.session.tenant
            if s.snap is not None:
                add_snapshot(totals.setdefault(tenant, Totals()), s.snap)
            memory[tenant] = memory.get(tenant, 0) + s.mem_used
            states[(tenant, s.state)] = states.get((tenant, s.state), 0) + 1
        L = ("tenant",)
        calls = CounterMetricFamily(
            "crane_tenant_calls", "Driver calls of the tenant's sessions, by op.", labels=(*L, "op")
        )
        latency = HistogramMetricFamily(
            "crane_tenant_call_duration_seconds",
            "Time workers spent executing the tenant's calls, by op.",
            labels=(*L, "op"),
        )
        launches = CounterMetricFamily("crane_tenant_kernel_launches", "Kernel launches.", labels=L)
        busy = CounterMetricFamily(
            "crane_tenant_gpu_busy_seconds",
            "GPU time in the tenant's kernels, copies and memsets.",
            labels=L,
        )
        kernel = CounterMetricFamily(
            "crane_tenant_kernel_seconds", "GPU time in the tenant's kernels.", labels=L
        )
        copied = CounterMetricFamily(
            "crane_tenant_copy_bytes", "Bytes copied, by direction.", labels=(*L, "direction")
        )
        for tenant, t in sorted(totals.items()):
            _add_totals(calls, latency, launches, busy, kernel, copied, (tenant,), t)
        mem = GaugeMetricFamily(
            "crane_tenant_memory_used_bytes", "Device memory the tenant's sessions hold.", labels=L
        )
        for tenant, v in sorted(memory.items()):
            mem.add_metric((tenant,), v)
        by_state = GaugeMetricFamily(
            "crane_sessions", "Sessions on this daemon, by state.", labels=("tenant", "state")
        )
        for (tenant, state), n in sorted(states.items()):
            by_state.add_metric((tenant, state), n)
        yield from (calls, latency, launches, busy, kernel, copied, mem, by_state)

    def _operations(self) -> Iterator[Metric]:
        _, ops = self.sessions.book.view()
        for what in ("checkpoint", "restore", "migration"):
            count = CounterMetricFamily(
                f"crane_{what}s",
                f"{what.capitalize()}s that ended, by result.",
                labels=("tenant", "result"),
            )
            dur = HistogramMetricFamily(
                f"crane_{what}_duration_seconds", f"How long {what}s took.", labels=("tenant",)
            )
            for (kind, tenant), st in sorted(ops.items()):
                if kind != what:
                    continue
                for result, n in sorted(st.results.items()):
                    count.add_metric((tenant, result), n)
                buckets = [
                    (str(le), n) for le, n in zip(OPERATION_BUCKETS_S, st.buckets, strict=True)
                ]
                buckets.append(("+Inf", st.count))
                dur.add_metric((tenant,), buckets, st.seconds)
            yield from (count, dur)


def _totals(snap: dict[str, Any]) -> Totals:
    t = Totals()
    add_snapshot(t, snap)
    return t


def _add_totals(
    calls: CounterMetricFamily,
    latency: HistogramMetricFamily,
    launches: CounterMetricFamily,
    busy: CounterMetricFamily,
    kernel: CounterMetricFamily,
    copied: CounterMetricFamily,
    labels: tuple[str, ...],
    t: Totals,
) -> None:
    for op, (n, ns, hist) in sorted(t.calls.items()):
        calls.add_metric((*labels, op), n)
        latency.add_metric((*labels, op), _buckets(hist, n), ns / 1e9)
    launches.add_metric(labels, t.launches)
    busy.add_metric(labels, (t.kernel_ns + t.copy_ns) / 1e9)
    kernel.add_metric(labels, t.kernel_ns / 1e9)
    for k in COPY_KINDS:
        copied.add_metric((*labels, k), t.bytes.get(k, 0))


def _buckets(hist: list[int], count: int) -> list[tuple[str, float]]:
    """The meter's log2 buckets as cumulative Prometheus buckets."""
    out, acc = [], 0
    for k in range(HIST_BUCKETS):
        acc += hist[k] if k < len(hist) else 0
        if _FIRST_BUCKET <= k <= _LAST_BUCKET:
            out.append((repr(bucket_upper_s(k)), acc))
    out.append(("+Inf", count))
    return out


def parse_listen(address: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` (every address) or ``[V6]:PORT`` -> (host, port)."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"metrics_listen must be HOST:PORT, not {address!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def start_exporter(
    address: str, sessions: SessionManager, registry: CollectorRegistry | None = None
) -> tuple[Any, int]:
    """Serve ``/metrics`` on ``address`` (a thread of this process); (server, port bound)."""
    host, port = parse_listen(address)
    reg = registry if registry is not None else CollectorRegistry(auto_describe=False)
    reg.register(MetricsCollector(sessions))
    server, _thread = start_http_server(port, addr=host, registry=reg)
    bound = server.server_address[1]
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return server, bound
