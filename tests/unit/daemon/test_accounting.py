"""The daemon's accounting book (crane.daemon.accounting) and the exporter's address."""

from __future__ import annotations

import pytest

from crane.api.ops import OPS, OPS_BY_NAME
from crane.daemon.accounting import OPERATION_BUCKETS_S, Accounting, Totals, add_snapshot
from crane.daemon.metrics import parse_listen
from crane.engine.meter import Meter


def snapshot(launches: int, h2d: int) -> dict:
    m = Meter(OPS, lambda h: "k")
    launch = OPS_BY_NAME["LAUNCH"].id
    for _ in range(launches):
        m.call(launch, 2000)
        m.work_call(launch, (1, None, 0), b"", 2000)
    m.work_call(OPS_BY_NAME["MEMCPY_HTOD"].id, (0, 0), b"x" * h2d, 10)
    return m.snapshot()


def test_ended_sessions_stay_in_their_tenants_totals() -> None:
    book = Accounting()
    book.retire("alice", snapshot(3, 100))
    book.retire("alice", snapshot(2, 50))
    book.retire("bob", snapshot(1, 7))
    book.retire("bob", None)  # a session that never published: nothing to keep
    ended, _ = book.view()
    assert ended["alice"].launches == 5 and ended["alice"].bytes["h2d"] == 150
    count, ns, hist = ended["alice"].calls["LAUNCH"]
    assert (count, ns, sum(hist)) == (5, 10_000, 5)
    assert ended["bob"].launches == 1
    # the view is a copy: adding to it does not change the book
    add_snapshot(ended["bob"], snapshot(9, 0))
    assert book.view()[0]["bob"].launches == 1


def test_operations_are_counted_by_result_and_timed_once() -> None:
    book = Accounting()
    book.operation("checkpoint", "alice", True, 0.3)
    book.operation("checkpoint", "alice", False, 70.0)
    book.migration_started("s1", 100.0)
    book.migration_over("s1", "alice", True, 102.0)
    book.migration_over("s1", "alice", True, 105.0)  # a second "over" of the same: ignored
    _, ops = book.view()
    cp = ops[("checkpoint", "alice")]
    assert dict(cp.results) == {"ok": 1, "error": 1} and cp.count == 2
    assert cp.seconds == pytest.approx(70.3)
    # cumulative buckets: 0.3 s is under every bound from 0.5 s on, 70 s only from 120 s on
    assert cp.buckets[OPERATION_BUCKETS_S.index(0.5)] == 1
    assert cp.buckets[OPERATION_BUCKETS_S.index(120.0)] == 2
    mig = ops[("migration", "alice")]
    assert mig.count == 1 and mig.seconds == pytest.approx(2.0)


def test_totals_start_empty() -> None:
    t = Totals()
    assert t.launches == 0 and t.bytes == {"h2d": 0, "d2h": 0, "d2d": 0}


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:9400", ("127.0.0.1", 9400)),
        (":9400", ("0.0.0.0", 9400)),
        ("[::1]:9400", ("::1", 9400)),
    ],
)
def test_metrics_listen_forms(address: str, expected: tuple[str, int]) -> None:
    assert parse_listen(address) == expected


@pytest.mark.parametrize("address", ["9400", "host:", "host:port"])
def test_metrics_listen_refused(address: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen(address)
