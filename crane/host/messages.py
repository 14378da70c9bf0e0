"""The messages craned and a session's worker exchange, typed at both ends.

Each frame on the channel (:mod:`crane.host.channel`) has a :class:`Tag`. Call batches and their
replies are opaque bytes (the daemon relays them without parsing: invariant 4), the device
identity a started worker answers is a ``DeviceIdentity`` protobuf, and everything else is one
of the dataclasses below, encoded by :func:`encode` and decoded by :func:`decode`, which refuses
a frame whose tag, type or fields do not match (:class:`MessageError`) rather than handing a
loose dict to code that would fail later and further away.

Daemon to worker: :class:`WorkerConfig` (once), ``BATCH``, :class:`CheckpointRequest`,
:class:`RestoreRequest`, :class:`MigrateRequest` (migrate out), :class:`RoundBegin` /
``MIGRATE_DATA`` / :class:`RoundEnd` (a migration round coming in).
Worker to daemon: ``STARTED`` (the identity), ``REPLY``, ``REPLY_LAST`` (the last reply to a batch
that expects one), ``CLOSE`` (the guest closed the session, or the worker cannot start: the
reason as text) and one control answer per control request: :class:`Checkpointed`,
:class:`Restored`, :class:`RoundApplied` or :class:`Refused`.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, ClassVar

from crane.state.checkpoint import FORMAT_VERSION
from crane.state.session_record import SessionRecord

__all__ = [
    "CheckpointRequest",
    "Checkpointed",
    "ControlAnswer",
    "DataPlaneOpen",
    "DataPlaneReady",
    "MessageError",
    "MigrateRequest",
    "Refused",
    "RestoreRequest",
    "Restored",
    "RoundApplied",
    "RoundBegin",
    "RoundEnd",
    "Tag",
    "WorkerConfig",
    "decode",
    "encode",
]


class Tag(IntEnum):
    CONFIG = 1  # daemon -> worker: WorkerConfig
    BATCH = 2  # daemon -> worker: a serialized CallBatch
    REPLY = 3  # worker -> daemon: a serialized ReplyBatch to forward
    REPLY_LAST = 4  # worker -> daemon: the last reply to a batch that expects one
    CLOSE = 5  # worker -> daemon: the session ended (text: why, if the worker could not start)
    CHECKPOINT = 6  # daemon -> worker: CheckpointRequest
    RESTORE = 7  # daemon -> worker: RestoreRequest
    CONTROL_REPLY = 8  # worker -> daemon: the answer to a control request
    MIGRATE = 9  # daemon -> worker: MigrateRequest
    MIGRATE_IN = 10  # daemon -> worker: RoundBegin
    MIGRATE_DATA = 11  # daemon -> worker: checkpoint-format bytes of the round
    MIGRATE_IN_END = 12  # daemon -> worker: RoundEnd
    STARTED = 13  # worker -> daemon: the DeviceIdentity the guest will be told


class MessageError(ValueError):
    """A frame that is not the message its tag announces."""


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs to serve one session."""

    TAG: ClassVar[Tag] = Tag.CONFIG
    session_id: str
    backend: str  # "sim" or "cuda"
    device_arg: str  # what the backend opens: a simulator profile key, or the CUDA ordinal
    va_base: int
    va_size: int
    uuid_seed: str  # hex; the session's virtual device identity derives from it
    ledger_path: str
    ledger_slot: int
    module_cache: str
    stats_path: str
    token: str = ""  # hex resume token, checked by the worker's direct endpoint
    direct_socket: str = ""  # unix socket path for guests on this host ("" = relay only)
    #: Who may connect to ``direct_socket`` besides the worker's own user: the uid of the
    #: local process that opened the session (-1: nobody else; its guest uses the relay).
    direct_uid: int = -1
    #: Offer the shared-memory call ring beside ``direct_socket`` (crane.worker.ring).
    call_ring: bool = True
    attach_timeout_s: float = 60.0  # end a session whose guest never attaches
    #: The daemon's tenant ledger (crane.device.quota; "": no tenant accounting), the
    #: session's tenant, and its kernel time limit in seconds (0: none).
    tenant_ledger: str = ""
    tenant: str = ""
    kernel_time_limit_s: float = 0.0
    #: The libvirt domain whose guest opened the session ("": none), for the worker's log lines.
    domain: str = ""
    module_cache_bytes: int = 0  # the module store's bound (0: unbounded), crane.modules.store
    #: The device model the guest is told (crane.device.model_file's plain form, memory
    #: already clipped to the device's), or {}: the device's own identity.
    model: dict[str, Any] = field(default_factory=dict)
    #: Count and time calls and GPU work (crane.engine.meter) and publish them; the profile's
    #: sliding window in seconds.
    accounting: bool = True
    profile_window_s: float = 60.0
    #: The worker's own TCP endpoint for remote guests, HOST:PORT ("": none), and what its
    #: callers must present (crane.daemon.worker_tcp.rules: TLS files, tenants' certificates).
    tcp_listen: str = ""
    tcp_rules: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointRequest:
    """Write the session to ``path``; ``release``: park it (no call may run here after).
    ``deadline``: ``time.monotonic()`` (one clock for every process of the host) by which the
    checkpoint must have started, i.e. the session's call in progress must have returned; the
    worker refuses at that moment instead of waiting on a kernel that may never end. 0: none."""

    TAG: ClassVar[Tag] = Tag.CHECKPOINT
    path: str
    release: bool
    identity: SessionRecord
    deadline: float = 0.0
    #: The checkpoint directory; ``path`` is relative to it (crane.host.checkpoint_dir).
    directory: str = ""


@dataclass(frozen=True)
class RestoreRequest:
    """Replay the checkpoint at ``path`` onto this (fresh) worker."""

    TAG: ClassVar[Tag] = Tag.RESTORE
    path: str
    #: The checkpoint directory; ``path`` is relative to it (crane.host.checkpoint_dir).
    directory: str = ""


@dataclass(frozen=True)
class MigrateRequest:
    """Move the session to the daemon at ``to`` (crane.migrate.source); progress goes to a
    file, and a byte to the FIFO ``wake`` after each update."""

    TAG: ClassVar[Tag] = Tag.MIGRATE
    to: str
    device: int
    max_rounds: int
    stop_bytes: int
    identity: SessionRecord
    wake: str = ""
    #: Seconds the migration waits for the call in progress at each batch boundary it needs.
    boundary_wait_s: float = 60.0
    #: The source daemon's certificate, key and the CA of its peers (PEM paths; "": none), for
    #: a tcp:// destination (mutual TLS).
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    #: Seconds the destination may make no progress (answer, drain the stream, acknowledge)
    #: while the source waits on it; past them the source aborts (crane.migrate.deadline).
    peer_timeout_s: float = 60.0
    #: The destination may offer less than the guest was told (never less than it uses).
    accept_lower_limits: bool = False
    #: Two-phase switchover (crane.migrate.source): after the final round the session stays
    #: frozen here until a Commit or Abort arrives on the FIFO ``decide`` (``gate``: the final
    #: round itself waits for a Stop there); none within ``hold_timeout_s`` aborts.
    hold: bool = False
    gate: bool = False
    hold_timeout_s: float = 120.0
    decide: str = ""


@dataclass(frozen=True)
class RoundBegin:
    """A migration round comes in: ``fresh`` replays everything, ``final`` switches over."""

    TAG: ClassVar[Tag] = Tag.MIGRATE_IN
    round: int
    fresh: bool
    final: bool


@dataclass(frozen=True)
class RoundEnd:
    """The round's bytes are all sent: apply it and answer. ``chunks``: memory chunks of the
    round that came over the data plane (the worker waits for them all before answering);
    ``handed_over``: the round's memory came as a descriptor on the hand-over socket (the
    worker maps it over its window before answering)."""

    TAG: ClassVar[Tag] = Tag.MIGRATE_IN_END
    chunks: int = 0
    handed_over: bool = False


@dataclass(frozen=True)
class DataPlaneOpen:
    """An incoming migration's worker opens its data plane (crane.migrate.dataplane): listen
    on ``bind`` (any port), accept only connections that present ``token`` (hex), over TLS with
    these PEM files when ``tls_cert`` is set; with ``handover`` (a path), also listen there for
    a same-host source's memory descriptor (crane.migrate.handover), same token. Answered with
    :class:`DataPlaneReady`."""

    TAG: ClassVar[Tag] = Tag.MIGRATE_IN
    bind: str
    token: str
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    handover: str = ""


@dataclass(frozen=True)
class DataPlaneReady:
    """The port an incoming migration's data plane listens on (0: none, ``error`` says why),
    and the hand-over socket it listens on ("": none, ``handover_error`` says why)."""

    TAG: ClassVar[Tag] = Tag.CONTROL_REPLY
    port: int
    error: str = ""
    handover: str = ""
    handover_error: str = ""


@dataclass(frozen=True)
class Checkpointed:
    TAG: ClassVar[Tag] = Tag.CONTROL_REPLY
    bytes: int
    memory_bytes: int
    sections: int


@dataclass(frozen=True)
class Restored:
    TAG: ClassVar[Tag] = Tag.CONTROL_REPLY
    done_seq: int
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundApplied:
    TAG: ClassVar[Tag] = Tag.CONTROL_REPLY
    done_seq: int
    final: bool


@dataclass(frozen=True)
class Refused:
    """A control request that could not be done; ``error`` says why (the session is as it
    was, except a restore or an incoming round, whose worker the daemon discards).
    ``late``: refused because the session's call in progress outlasted the request's
    deadline (the caller reports a time-out, not a failure of the operation itself)."""

    TAG: ClassVar[Tag] = Tag.CONTROL_REPLY
    error: str
    late: bool = False


ControlAnswer = Checkpointed | Restored | RoundApplied | DataPlaneReady | Refused

_TYPES: dict[str, type] = {
    c.__name__: c
    for c in (
        WorkerConfig,
        CheckpointRequest,
        RestoreRequest,
        MigrateRequest,
        RoundBegin,
        RoundEnd,
        DataPlaneOpen,
        DataPlaneReady,
        Checkpointed,
        Restored,
        RoundApplied,
        Refused,
    )
}


def _to_json(value: Any) -> Any:
    return value.to_json() if isinstance(value, SessionRecord) else value


def encode(msg: Any) -> tuple[Tag, bytes]:
    """The frame of a typed message: its tag and its payload."""
    body = {f.name: _to_json(getattr(msg, f.name)) for f in dataclasses.fields(msg)}
    body["type"] = type(msg).__name__
    return msg.TAG, json.dumps(body).encode()


def decode(tag: int, raw: bytes) -> Any:
    """The typed message a frame carries; :class:`MessageError` says what does not fit."""
    try:
        body = json.loads(raw)
        cls = _TYPES[body.pop("type")]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise MessageError(f"frame with tag {tag} is not a typed message: {e!r}") from None
    if tag != cls.TAG:
        raise MessageError(f"a {cls.__name__} cannot come with tag {tag}")
    hints = typing.get_type_hints(cls)
    try:
        for name, value in list(body.items()):
            if hints.get(name) is SessionRecord:
                record = {"session": value}
                body[name], _ = SessionRecord.from_meta(record, FORMAT_VERSION, cls.__name__)
        return cls(**body)
    except (TypeError, ValueError, KeyError) as e:
        raise MessageError(f"malformed {cls.__name__}: {e!r}") from None
