"""Talking to a session's worker: starting it with its configuration, and control requests.

The relay moves a guest's batches without parsing them (:mod:`crane.daemon.guest_service`);
everything else the daemon asks of a worker is a typed message (:mod:`crane.host.messages`)
answered by a typed message, sent while the session's ``channel_lock`` is held so that it comes
between two batches.
"""

from __future__ import annotations

from crane.api.errors import ProtocolError
from crane.daemon.session import DaemonSession
from crane.daemon.workers import WorkerProcess
from crane.host.channel import ChannelClosed
from crane.host.messages import (
    ControlAnswer,
    MessageError,
    Refused,
    Tag,
    WorkerConfig,
    decode,
    encode,
)
from crane.v1 import common_pb2

__all__ = ["configure", "reason", "request"]


def configure(worker: WorkerProcess, cfg: WorkerConfig) -> common_pb2.DeviceIdentity:
    """Hand a pooled worker its session; the device identity its guest will be told. Stops the
    worker and raises INTERNAL when it cannot start (the reason from the worker)."""
    try:
        worker.channel.send(*encode(cfg))
        tag, raw = worker.channel.recv()
    except ChannelClosed as e:
        worker.stop()
        raise ProtocolError("INTERNAL", f"session worker died while starting: {e}") from None
    if tag != Tag.STARTED:
        worker.stop()
        why = raw.decode(errors="replace") or "it ended without a reason"
        raise ProtocolError("INTERNAL", f"session worker failed: {why}")
    return common_pb2.DeviceIdentity.FromString(raw)


def reason(answer: ControlAnswer) -> str:
    """Why a control request failed, from an answer that is not the one it asked for."""
    return answer.error if isinstance(answer, Refused) else f"unexpected answer {answer!r}"


def request(session: DaemonSession, msg: object) -> ControlAnswer:
    """Send a control request and wait for its answer (call with ``channel_lock`` held).
    Asynchronous failures the worker reports meanwhile are kept for the relay to forward;
    :class:`ChannelClosed` when the worker goes away (or the guest closed the session)."""
    ch = session.worker.channel
    ch.send(*encode(msg))
    while True:
        tag, raw = ch.recv()
        if tag == Tag.CONTROL_REPLY:
            try:
                return decode(tag, raw)
            except MessageError as e:
                raise ChannelClosed(f"the worker answered nonsense: {e}") from None
        if tag == Tag.CLOSE:
            raise ChannelClosed("the guest closed the session")
        session.pending.append(raw)  # an asynchronous failure for the relay to forward
