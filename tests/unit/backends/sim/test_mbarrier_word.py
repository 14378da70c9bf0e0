"""The mbarrier word's phase arithmetic (crane.backends.sim.ptx.mbarrier), lane by lane."""

from __future__ import annotations

import numpy as np

from crane.backends.sim.ptx import mbarrier as mb


def _serial(w, counts, drop=False, no_complete=False, txs=None):
    """Reference: one lane at a time with the scalar fields."""
    p, e, tx, ph = mb.unpack(w)
    states = []
    for i, c in enumerate(counts):
        if txs is not None:
            tx += txs[i]
        p = max(p - c, 0)
        if drop:
            e = max(e - c, 0)
        states.append(mb.pack(p, e, tx, ph))
        if not no_complete and p == 0 and tx == 0:
            p, tx, ph = e, 0, (ph + 1) & 7
    return mb.pack(p, e, tx, ph), states


def test_fields_round_trip_with_negative_tx():
    w = mb.pack(5, 9, -300, 6)
    assert mb.unpack(w) == (5, 9, -300, 6)
    assert mb.phase_of(np.array([w], np.uint64))[0] == 6
    assert mb.pending_of(np.array([w], np.uint64))[0] == 5


def test_vectorized_arrivals_match_one_lane_at_a_time():
    rng = np.random.default_rng(3)
    for _ in range(200):
        expected = int(rng.integers(1, 40))
        counts = rng.integers(1, 4, int(rng.integers(1, 120))).astype(np.int64)
        drop = bool(rng.integers(0, 2))
        w0 = mb.init_word(expected)
        w, states = mb.arrive(w0, counts, drop, False)
        rw, rstates = _serial(w0, counts.tolist(), drop)
        assert w == rw
        assert [int(s) for s in states] == rstates


def test_phase_waits_for_transactions():
    w = mb.init_word(2)
    w, _ = mb.arrive(w, np.array([1]), False, False, np.array([100]))  # arrive.expect_tx
    w, _ = mb.arrive(w, np.array([1]), False, False)
    assert mb.unpack(w) == (0, 2, 100, 0)  # arrivals done, bytes outstanding
    w = mb.update_tx(w, np.array([-60]))
    assert mb.unpack(w)[3] == 0
    w = mb.update_tx(w, np.array([-40]))
    assert mb.unpack(w) == (2, 2, 0, 1)  # phase 1 began


def test_complete_tx_before_expect_tx_and_no_complete():
    w = mb.init_word(1)
    w = mb.update_tx(w, np.array([-64]))  # the copy landed first
    w, _ = mb.arrive(w, np.array([1]), False, False)
    assert mb.unpack(w)[3] == 0  # count is -64: not complete
    w = mb.update_tx(w, np.array([64]))
    assert mb.unpack(w) == (1, 1, 0, 1)  # the expected bytes had all landed: phase complete
    w, _ = mb.arrive(mb.init_word(3), np.array([3]), False, True)
    assert mb.unpack(w) == (0, 3, 0, 0)  # .noComplete leaves the phase open
