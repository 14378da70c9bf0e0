"""A session's profile as the Control service answers it (``crane profile``, ``crane top``).

Read from what the session's worker last published (crane.host.stats.SnapshotFile), never by
asking the worker: a session inside a long kernel answers at once, with the kernel counted when
it completes.
"""

from __future__ import annotations

import time

from crane.daemon.expiry import Expiry
from crane.daemon.lifecycle import SessionState
from crane.daemon.registry import SessionTable
from crane.daemon.render import session_info
from crane.daemon.session import DaemonSession
from crane.engine.meter import profile_view
from crane.host.stats import SnapshotFile, snapshot_path
from crane.v1 import control_pb2

__all__ = ["session_profile"]


def session_profile(
    s: DaemonSession, table: SessionTable, expiry: Expiry, window_s: float, top: int = 0
) -> control_pb2.SessionProfile:
    """``s``'s profile; ``accounting`` false when there is none (accounting off, parked,
    moved away, or nothing published yet)."""
    out = control_pb2.SessionProfile(
        session=session_info(s, table, expiry), window_seconds=window_s
    )
    if s.state in (SessionState.PARKED, SessionState.MIGRATED):
        return out
    snap = SnapshotFile(snapshot_path(s.stats_path)).read()
    if snap is None:
        return out
    view = profile_view(snap["profile"])
    kernels = view["kernels"][:top] if top > 0 else view["kernels"]
    out.accounting = True
    out.window_seconds = view["window_s"]
    out.span_seconds = view["span_s"]
    out.kernel_share = view["kernel_share"]
    out.copy_share = view["copy_share"]
    out.idle_share = view["idle_share"]
    out.kernel_seconds = view["kernel_s"]
    out.copy_seconds = view["copy_s"]
    out.kernels.extend(
        control_pb2.KernelProfile(
            name=k["name"], gpu_seconds=k["gpu_s"], launches=k["launches"], mean_seconds=k["mean_s"]
        )
        for k in kernels
    )
    b = snap.get("bytes", {})
    out.launches = snap.get("launches", 0)
    out.bytes_h2d, out.bytes_d2h, out.bytes_d2d = b.get("h2d", 0), b.get("d2h", 0), b.get("d2d", 0)
    out.gpu_busy_seconds = (snap.get("kernel_ns", 0) + snap.get("copy_ns", 0)) / 1e9
    out.age_seconds = max(time.monotonic() - snap.get("published", time.monotonic()), 0.0)
    return out
