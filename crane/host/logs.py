"""craned's and its workers' logging: one set-up, human lines or JSON lines, and the session,
tenant and domain on every line about a session.

Why a context and not the messages: a session's lines come from many modules (the Guest and
Control services, checkpoints, migrations, expiry, the reaper, the worker) and most name the
session in passing or not at all. A :class:`contextvars.ContextVar` says which session the code
running now is about; :class:`ContextFilter` copies it onto every record, so every line gets it
without rewording a message, and a log pipeline can select a tenant's lines by field.

Where the context comes from:

* **an RPC** runs in a fresh context of its own (:mod:`crane.wire.handlers` gives each call
  one), and the daemon :func:`bind`\\ s the session the call concerns once it has found it;
* **a thread** the daemon starts about a session (its reaper, a migration's watcher, the
  expiry sweep, a hold's timer) wraps what it does in :func:`about`;
* **a worker process** serves one session: :func:`set_process_context` once, when its
  configuration arrives (its gRPC threads and timers carry it too);
* a call may also pass ``extra={"session": ..., "tenant": ..., "domain": ...}``, which wins.

Formats: ``text`` (the default) keeps the human line with a compact prefix
``[s=3f2a9c1b7d04 t=alice d=vm1]`` (fields it does not know are left out); ``json`` writes one
object per line: ``ts`` (RFC 3339, UTC, milliseconds), ``level``, ``logger``, ``proc``
(``craned`` or ``worker``), ``pid``, ``msg``, ``session``/``tenant``/``domain`` when known and
``exc`` (the formatted traceback) for exceptions. The standard library suffices for that; a
dependency (python-json-logger) would add nothing but a field-renaming layer.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol, TextIO

__all__ = [
    "FIELDS",
    "FORMATS",
    "ContextFilter",
    "JsonFormatter",
    "LogContext",
    "TextFormatter",
    "about",
    "bind",
    "bind_session",
    "current",
    "set_process_context",
    "setup",
]

#: The formats ``--log-format`` and ``log_format`` accept.
FORMATS = ("text", "json")
#: The context fields every record gets (None where unknown).
FIELDS = ("session", "tenant", "domain")
_PREFIX = {"session": "s", "tenant": "t", "domain": "d"}


@dataclass(frozen=True)
class LogContext:
    """Which session the running code is about ("" where not known)."""

    session: str = ""
    tenant: str = ""
    domain: str = ""


class SessionLike(Protocol):
    """A daemon session or a session record: an id, its tenant and its libvirt domain."""

    @property
    def id(self) -> str: ...

    @property
    def tenant(self) -> str: ...

    @property
    def domain(self) -> str: ...


_CONTEXT: contextvars.ContextVar[LogContext | None] = contextvars.ContextVar(
    "crane_log_context", default=None
)
#: A worker process's own session: the context of every line it writes that has none closer.
_PROCESS = LogContext()


def _of(session: SessionLike) -> LogContext:
    return LogContext(session.id, session.tenant or "", session.domain or "")


def current() -> LogContext:
    """The context records get now: the innermost binding, else the process's own."""
    return _CONTEXT.get() or _PROCESS


def bind(session: str = "", tenant: str = "", domain: str = "") -> None:
    """Say that the rest of the current context (an RPC's own) is about this session. Fields
    not given keep what an earlier binding said (a call that learns the tenant after the id)."""
    now = _CONTEXT.get() or LogContext()
    given = {"session": session, "tenant": tenant, "domain": domain}
    _CONTEXT.set(replace(now, **{k: v for k, v in given.items() if v}))


def bind_session(session: SessionLike) -> None:
    """:func:`bind` a daemon session (or a session record)."""
    _CONTEXT.set(_of(session))


@contextlib.contextmanager
def about(session: SessionLike) -> Iterator[None]:
    """Lines logged inside are about ``session`` (for threads and timers outside an RPC)."""
    token = _CONTEXT.set(_of(session))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def set_process_context(session: str, tenant: str = "", domain: str = "") -> None:
    """A worker process: every line it writes is about its one session."""
    global _PROCESS
    _PROCESS = LogContext(session, tenant, domain)


class ContextFilter(logging.Filter):
    """Puts ``session``, ``tenant`` and ``domain`` on every record (an ``extra=`` given to the
    call wins; unknown ones are None). Installed on the handler, so records of every logger
    (craned's, the RPC boundary's, the backends') get them."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = current()
        for name in FIELDS:
            if getattr(record, name, None) is None:
                setattr(record, name, getattr(ctx, name) or None)
        return True


def _prefix(record: logging.LogRecord) -> str:
    parts = [f"{_PREFIX[k]}={v}" for k in FIELDS if (v := getattr(record, k, None))]
    return f"[{' '.join(parts)}] " if parts else ""


class TextFormatter(logging.Formatter):
    """The human line: ``TIME PROC LEVEL [s=.. t=.. d=..] message``."""

    def __init__(self, proc: str) -> None:
        super().__init__(f"%(asctime)s {proc} %(levelname)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        prefix = _prefix(record)
        if not prefix:
            return line
        head = f" {record.levelname} "
        at = line.find(head)
        return line if at < 0 else line[: at + len(head)] + prefix + line[at + len(head) :]


class JsonFormatter(logging.Formatter):
    """One JSON object per line (see the module's docstring for the fields)."""

    def __init__(self, proc: str) -> None:
        super().__init__()
        self.proc = proc

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _rfc3339(record.created),
            "level": record.levelname,
            "logger": record.name,
            "proc": self.proc,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value:
                out[name] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def _rfc3339(t: float) -> str:
    ms = int(t * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{ms:03d}Z"


def setup(level: str, fmt: str, proc: str, stream: TextIO | None = None) -> None:
    """Log to ``stream`` (stderr) at ``level`` in ``fmt`` (one of :data:`FORMATS`) as ``proc``
    (``craned`` or ``worker``: JSON's ``proc``; a text line says ``craned`` or
    ``craned[worker]``).
    Replaces any handler set before (logging.basicConfig's, say)."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(ContextFilter())
    label = proc if proc == "craned" else f"craned[{proc}]"
    handler.setFormatter(JsonFormatter(proc) if fmt == "json" else TextFormatter(label))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
