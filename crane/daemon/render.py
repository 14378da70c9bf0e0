"""The daemon's objects as its services answer them (protobuf), in one place.

What ``crane ps`` shows of a session (:func:`session_info`), what a guest is told when its
session opens or resumes (:func:`opened`), and what ``crane devices`` shows of a device
(:func:`device_info`).
"""

from __future__ import annotations

import time

from crane import __version__
from crane.daemon.callers import Caller
from crane.daemon.devices import Device
from crane.daemon.expiry import Expiry, age
from crane.daemon.gpu_inventory import gpu_status
from crane.daemon.lifecycle import SessionState
from crane.daemon.registry import SessionTable
from crane.daemon.session import DaemonSession
from crane.daemon.worker_tcp import tcp_direct_address
from crane.device.layout import CHUNK_GRANULARITY, GUEST_SPAN, WINDOW_SIZE
from crane.host.stats import TRANSPORTS, WORKER_MODES
from crane.v1 import common_pb2, guest_pb2
from crane.wire.status import DRIVER_VERSION, MAX_CHUNK

__all__ = ["device_info", "opened", "session_info"]


def session_info(s: DaemonSession, table: SessionTable, expiry: Expiry) -> common_pb2.SessionInfo:
    try:
        calls, mem, _, mode, peer = s.stats.read()
    except ValueError:  # closed under us
        calls, mem, mode, peer = 0, 0, 0, ""
    direct = mode in WORKER_MODES
    location = s.location
    now = time.monotonic()
    if s.state is SessionState.PARKED:
        location = f"in {s.parked_at}"
        if expiry.parked_ttl_s > 0:
            left = expiry.parked_ttl_s - (now - s.parked_since)
            location += f", expires in {age(left)}"
    elif s.state is SessionState.MIGRATED and expiry.moved_ttl_s > 0:
        gone = table.moved.get(s.id)
        if gone is not None and gone.session is s:
            location += f", forgotten in {age(expiry.moved_ttl_s - (now - gone.since))}"
    # a guest attached straight to its worker never passes the relay: the daemon's entry
    # stays "ready", the stats page says it runs
    state = SessionState.RUNNING if direct and s.state is SessionState.READY else s.state
    return common_pb2.SessionInfo(
        id=s.id,
        peer=peer if direct else s.peer,
        device=s.device.index,
        mem_used=mem,
        calls=calls,
        state=state.value,
        client=s.client,
        opened_at=s.opened_at,
        va_base=s.va_base,
        va_size=WINDOW_SIZE,
        location=location,
        tenant=s.tenant,
        domain=s.domain,
        model=s.identity.profile,
        model_name=s.identity.name,
        transport=TRANSPORTS.get(mode, ""),
    )


def opened(s: DaemonSession, caller: Caller | None = None) -> guest_pb2.OpenSessionReply:
    """What the guest is told; ``caller``: who asked, which decides the worker endpoint offered
    (a unix caller: the worker's socket; a tcp one: its TCP port, when it has one)."""
    direct = f"unix://{s.direct_socket}" if s.direct_socket else ""
    if caller is not None and not caller.unix and s.tcp_port:
        direct = tcp_direct_address(s.tcp_port)
    return guest_pb2.OpenSessionReply(
        session_id=s.id,
        resume_token=s.token,
        va_base=s.va_base,
        va_size=GUEST_SPAN,
        device=s.identity,
        driver_version=DRIVER_VERSION,
        chunk_granularity=CHUNK_GRANULARITY,
        max_batch_bytes=MAX_CHUNK,
        daemon_version=__version__,
        direct_address=direct,
    )


def device_info(d: Device, used: int, sessions: int) -> common_pb2.DeviceInfo:
    util, mig = -1, "n/a"
    if d.backend == "cuda":
        status = gpu_status(int(d.arg))
        util, mig = status.utilization_pct, status.mig_mode
    return common_pb2.DeviceInfo(
        index=d.index,
        backend=d.backend,
        name=d.name,
        uuid=d.uuid,
        total_mem=d.total_mem,
        used_mem=used,
        cc_major=d.cc[0],
        cc_minor=d.cc[1],
        profile=d.arg,
        sessions=sessions,
        utilization_pct=util,
        mig_mode=mig,
        driver_version=d.driver_version,
        model=d.model_key,
        model_name=d.model.name if d.model is not None else "",
        model_total_mem=d.offered_total,
        model_cc_major=d.offered_cc[0],
        model_cc_minor=d.offered_cc[1],
        attributes=d.attributes,
    )
