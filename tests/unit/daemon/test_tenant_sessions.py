"""The session table counts a tenant's sessions on their way in against its max_sessions."""

from __future__ import annotations

import pytest

from crane.api.errors import ProtocolError
from crane.daemon.registry import SessionTable


def test_a_tenant_at_its_limit_is_refused_by_name() -> None:
    table = SessionTable(16, {"alice": 2})
    with table.reserve("alice"), table.reserve("alice"):
        with pytest.raises(ProtocolError) as e, table.reserve("alice"):
            pass
        assert e.value.status == "RESOURCE_EXHAUSTED"
        assert "tenant alice is at its limit of 2 sessions" in str(e.value)
        # other tenants, and callers of no tenant, are not counted against alice
        with table.reserve("bob"), table.reserve(""):
            pass
    # both slots were handed back: alice may open again
    with table.reserve("alice"):
        assert table.tenant_refusal("alice") == ""


def test_restores_and_migrations_claim_slots_counted_the_same() -> None:
    table = SessionTable(16, {"alice": 1})
    with table.lock:
        table.claim_slot(5, "alice")
        assert table.tenant_refusal("alice") == "tenant alice is at its limit of 1 sessions"
        table.unclaim_slot(5)
        assert table.tenant_refusal("alice") == ""


def test_zero_sessions_refuses_every_open() -> None:
    table = SessionTable(16, {"nobody": 0})
    with pytest.raises(ProtocolError), table.reserve("nobody"):
        pass
