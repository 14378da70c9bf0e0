"""The daemon's session lifecycle: a transition table, and operations refused by name."""

from __future__ import annotations

import pytest

from crane.api.errors import ProtocolError
from crane.daemon import lifecycle
from crane.daemon.lifecycle import OPERATIONS, TRANSITIONS, SessionState
from crane.daemon.session import DaemonSession
from crane.migrate.phases import TRANSITIONS as PHASES
from crane.migrate.phases import Phase, advance


def _session(state: SessionState) -> DaemonSession:
    return DaemonSession(
        id="abc",
        token=b"t",
        device=None,  # type: ignore[arg-type]
        slot=1,
        worker=None,  # type: ignore[arg-type]
        identity=None,  # type: ignore[arg-type]
        client="",
        stats=None,  # type: ignore[arg-type]
        stats_path=None,  # type: ignore[arg-type]
        state=state,
    )


def test_every_state_has_its_transitions_and_every_target_is_a_state() -> None:
    assert set(TRANSITIONS) == set(SessionState)
    for targets in TRANSITIONS.values():
        assert targets <= set(SessionState)
    # the terminal states, and only they, lead nowhere
    assert {s for s, t in TRANSITIONS.items() if not t} == {
        SessionState.CLOSED,
        SessionState.MIGRATED,
    }


def test_every_state_is_reachable_from_an_entry_state() -> None:
    seen = {SessionState.READY, SessionState.RESTORING, SessionState.INCOMING}
    frontier = list(seen)
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(SessionState)


def test_named_state_sets_are_states() -> None:
    for name in ("RETRY_LATER", "ENDS_NOTHING", "WORKER_MAY_EXIT", "AWAY"):
        assert getattr(lifecycle, name) <= set(SessionState), name
    for op, states in OPERATIONS.items():
        assert states and states <= set(SessionState), op


def test_an_operation_is_refused_by_name_in_a_state_that_forbids_it() -> None:
    s = _session(SessionState.PARKED)
    with pytest.raises(ProtocolError) as e:
        s.require("checkpoint")
    assert e.value.status == "FAILED_PRECONDITION"
    assert e.value.message == "session abc is parked; checkpoint needs it ready or running"
    _session(SessionState.RUNNING).require("checkpoint")


def test_a_transition_the_table_lacks_is_a_bug() -> None:
    s = _session(SessionState.READY)
    s.move(SessionState.RUNNING)
    with pytest.raises(RuntimeError, match="running -> parked"):
        s.move(SessionState.PARKED)
    assert s.state is SessionState.RUNNING


def test_migration_phases() -> None:
    assert set(PHASES) == set(Phase)
    assert advance(Phase.PREFLIGHT, Phase.STOPPING) is Phase.STOPPING  # stop-and-copy
    with pytest.raises(RuntimeError, match="precopy cannot become preflight"):
        advance(Phase.PRECOPY, Phase.PREFLIGHT)
    assert all(p.over for p in Phase if not PHASES[p])
