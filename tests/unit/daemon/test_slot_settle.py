"""A restore or an arriving migration waits a moment for its window's holder to leave: a guest's
close reaches only its worker, and the daemon forgets the session when that worker exits."""

from __future__ import annotations

import threading
import time

from crane.daemon.registry import SessionTable


def test_a_slot_being_given_back_is_waited_for() -> None:
    table = SessionTable(16)
    with table.lock:
        table.claim_slot(10)

    def give_back() -> None:
        time.sleep(0.2)
        with table.lock:
            table.unclaim_slot(10)

    threading.Thread(target=give_back).start()
    t0 = time.monotonic()
    table.settle_slot("s1", 10, grace_s=5.0)
    waited = time.monotonic() - t0
    assert 0.15 < waited < 4.0
    with table.lock:
        assert table.slot_refusals("s1", 10) == []


def test_a_holder_that_stays_is_waited_for_only_the_grace() -> None:
    table = SessionTable(16)
    with table.lock:
        table.claim_slot(3)
    t0 = time.monotonic()
    table.settle_slot("s1", 3, grace_s=0.3)
    assert 0.25 < time.monotonic() - t0 < 3.0
    with table.lock:
        assert table.slot_refusals("s1", 3)  # still refused, by name, after the grace


def test_a_free_slot_costs_no_wait() -> None:
    table = SessionTable(16)
    t0 = time.monotonic()
    table.settle_slot("s1", 7, grace_s=5.0)
    assert time.monotonic() - t0 < 0.5
