"""The worker's side of a session: one call stream at a time, and a lifecycle by table."""

from __future__ import annotations

from pathlib import Path

import pytest

from crane.backends.factory import make_backend
from crane.device.layout import WINDOW_SIZE, window_base
from crane.engine.engine import Engine
from crane.host.stats import MODE_DIRECT, MODE_RELAY, SessionStats
from crane.modules.store import ImageStore
from crane.worker.attach import (
    ALLOWED,
    TRANSITIONS,
    NotAllowed,
    SessionParked,
    WorkerSession,
    WorkerState,
)


@pytest.fixture
def ws(tmp_path: Path) -> WorkerSession:
    window = (window_base(2), WINDOW_SIZE)
    backend = make_backend("sim", "l4", window, b"seed", str(tmp_path / "ledger"), 2)
    engine = Engine.create(backend, "s1", window, ImageStore(tmp_path))
    return WorkerSession(engine, "s1", SessionStats(tmp_path / "stats"))


def test_tables_cover_every_state() -> None:
    assert set(TRANSITIONS) == set(WorkerState)
    for states in ALLOWED.values():
        assert states <= set(WorkerState)


def test_the_first_stream_wins_and_fixes_the_mode(ws: WorkerSession) -> None:
    assert ws.attach(MODE_DIRECT, "guest")
    assert ws.state is WorkerState.DIRECT and ws.attached.is_set()
    assert not ws.attach(MODE_RELAY, "relay")
    assert ws.state is WorkerState.DIRECT


def test_a_parked_session_runs_no_call(ws: WorkerSession) -> None:
    with pytest.raises(NotAllowed, match="s1 is waiting; run calls needs it direct or relay"):
        ws.run(b"")
    assert ws.attach(MODE_RELAY)
    ws.move(WorkerState.PARKED)
    with pytest.raises(SessionParked, match="s1 is parked"):
        ws.run(b"")
    with pytest.raises(SessionParked):
        ws.require("checkpoint")
    with pytest.raises(RuntimeError, match="parked -> relay"):
        ws.move(WorkerState.RELAY)
    ws.end()
    assert ws.state is WorkerState.ENDED and ws.ended.is_set()


def test_acquire_by_gives_up_at_the_deadline_and_says_why(ws: WorkerSession) -> None:
    import time

    from crane.worker.attach import TooLate

    with ws.lock:  # a batch that does not return
        ws.busy_since = time.monotonic() - 5.0
        t0 = time.monotonic()
        with pytest.raises(TooLate, match=r"running for 5\.\d s .*did not return by the deadline"):
            ws.acquire_by(t0 + 0.2, "checkpoint")
        assert 0.15 < time.monotonic() - t0 < 2.0
        with pytest.raises(TooLate):
            ws.acquire_by(t0 - 1.0, "checkpoint")  # a deadline already past: no wait at all
    ws.busy_since = 0.0
    ws.acquire_by(time.monotonic() + 0.2, "checkpoint")  # free: taken at once
    ws.lock.release()
