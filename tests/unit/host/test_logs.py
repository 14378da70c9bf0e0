"""crane.host.logs: the formats, and the context that puts a session on its lines."""

from __future__ import annotations

import contextvars
import io
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from crane.host import logs


@dataclass
class _Session:
    id: str
    tenant: str = ""
    domain: str = ""


@pytest.fixture
def capture() -> Iterator[tuple[io.StringIO, logging.Logger]]:
    """A handler set up as craned's would be, writing into a buffer; the root logger restored."""
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    buf = io.StringIO()
    yield buf, logging.getLogger("craned.test")
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in saved:
        root.addHandler(h)
    root.setLevel(level)
    logs.set_process_context("")


def _json_lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_json_lines_carry_the_bound_session(capture: tuple[io.StringIO, logging.Logger]) -> None:
    buf, log = capture
    logs.setup("info", "json", "craned", buf)

    def call() -> None:  # as an RPC: a context of its own
        log.info("before binding")
        logs.bind_session(_Session("ab12", "alice", "vm1"))
        log.warning("session %s opened", "ab12")

    contextvars.Context().run(call)
    log.info("after the call")
    first, bound, after = _json_lines(buf)
    assert "session" not in first and "tenant" not in first
    assert bound["session"] == "ab12" and bound["tenant"] == "alice" and bound["domain"] == "vm1"
    assert bound["level"] == "WARNING" and bound["logger"] == "craned.test"
    assert bound["msg"] == "session ab12 opened" and bound["proc"] == "craned"
    assert str(bound["ts"]).endswith("Z") and "T" in str(bound["ts"])
    assert "session" not in after  # the binding ended with the call's context


def test_about_scopes_a_thread_and_extra_wins(capture: tuple[io.StringIO, logging.Logger]) -> None:
    buf, log = capture
    logs.setup("info", "json", "craned", buf)

    def reaper() -> None:
        with logs.about(_Session("cd34", "bob")):
            log.info("worker exited")
            log.info("explicit", extra={"session": "ef56"})
        log.info("outside")

    t = threading.Thread(target=reaper)
    t.start()
    t.join()
    inside, explicit, outside = _json_lines(buf)
    assert inside["session"] == "cd34" and inside["tenant"] == "bob" and "domain" not in inside
    assert explicit["session"] == "ef56"
    assert "session" not in outside


def test_exceptions_come_as_one_json_field(capture: tuple[io.StringIO, logging.Logger]) -> None:
    buf, log = capture
    logs.setup("info", "json", "worker", buf)
    logs.set_process_context("9a9a", "carol")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("cannot start the backend")
    (line,) = _json_lines(buf)
    assert line["session"] == "9a9a" and line["tenant"] == "carol" and line["proc"] == "worker"
    assert "RuntimeError: boom" in str(line["exc"])
    assert len(buf.getvalue().splitlines()) == 1  # the traceback stays inside the object


def test_text_lines_have_the_compact_prefix(capture: tuple[io.StringIO, logging.Logger]) -> None:
    buf, log = capture
    logs.setup("info", "text", "worker", buf)
    log.info("no session yet")
    with logs.about(_Session("ab12", "alice", "vm1")):
        log.info("checkpoint written")
    plain, tagged = buf.getvalue().splitlines()
    assert plain.endswith(" craned[worker] INFO no session yet")
    assert tagged.endswith(" craned[worker] INFO [s=ab12 t=alice d=vm1] checkpoint written")


def test_bind_keeps_fields_not_given() -> None:
    def call() -> logs.LogContext:
        logs.bind(session="ab12")
        logs.bind(tenant="alice")
        return logs.current()

    assert contextvars.Context().run(call) == logs.LogContext("ab12", "alice", "")


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="text, json"):
        logs.setup("info", "yaml", "craned")
