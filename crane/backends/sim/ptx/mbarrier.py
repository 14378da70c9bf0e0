"""The mbarrier object: a 64-bit word in shared memory and its phase arithmetic.

PTX leaves the object's layout opaque; the simulator's encoding of the 8 bytes is

* bits 0..19: pending arrivals of the current phase,
* bits 20..39: expected arrivals (what ``pending`` resets to when a phase completes),
* bits 40..60: the transaction count (signed, 21 bits: ``complete_tx`` may come first),
* bits 61..63: the phase number, modulo 8 (its low bit is the parity ``.parity`` waits take).

A phase completes when its pending arrivals reach zero *and* its transaction count is zero;
then the phase number advances, ``pending`` becomes ``expected`` and the count resets. The
state an ``arrive`` returns is the word right after that thread's arrival, in the phase it
arrived on, so ``test_wait``/``try_wait`` on it compare phase numbers and ``pending_count``
reads its pending field.

Arrivals of many lanes on one barrier are applied in lane order; they are vectorized between
phase completions (a whole CTA arriving at once is one NumPy step per barrier).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "MAX_COUNT",
    "arrive",
    "init_word",
    "pack",
    "pending_of",
    "phase_of",
    "unpack",
    "update_tx",
]

MAX_COUNT = (1 << 20) - 1
_M20 = (1 << 20) - 1
_M21 = (1 << 21) - 1


def pack(pending, expected, tx, phase):
    """Fields → words (ints or uint64 arrays)."""
    if isinstance(pending, np.ndarray) or isinstance(expected, np.ndarray):
        p = np.asarray(pending, np.int64).astype(np.uint64)
        e = np.asarray(expected, np.int64).astype(np.uint64)
        t = np.uint64(int(tx) & _M21)
        return p | (e << np.uint64(20)) | (t << np.uint64(40)) | np.uint64((phase & 7) << 61)
    return (
        (int(pending) & _M20)
        | ((int(expected) & _M20) << 20)
        | ((int(tx) & _M21) << 40)
        | ((phase & 7) << 61)
    )


def unpack(w: int) -> tuple[int, int, int, int]:
    w = int(w)
    tx = (w >> 40) & _M21
    if tx >> 20:
        tx -= 1 << 21
    return w & _M20, (w >> 20) & _M20, tx, (w >> 61) & 7


def init_word(count: int) -> int:
    return pack(count, count, 0, 0)


def phase_of(words) -> np.ndarray:
    return (np.asarray(words, np.uint64) >> np.uint64(61)).astype(np.uint32)


def pending_of(words) -> np.ndarray:
    return (np.asarray(words, np.uint64) & np.uint64(_M20)).astype(np.uint32)


def _complete(p: int, e: int, tx: int, ph: int) -> tuple[int, int, int, int]:
    if p == 0 and tx == 0:
        return e, e, 0, (ph + 1) & 7
    return p, e, tx, ph


def arrive(
    w: int, counts: np.ndarray, drop: bool, no_complete: bool, tx_add: np.ndarray | None = None
) -> tuple[int, np.ndarray]:
    """Lanes arrive in order on the barrier word ``w``, each with its count (and first adds
    ``tx_add`` to the transaction count: ``arrive.expect_tx``). Returns the new word and each
    lane's state. ``drop`` also lowers the expected count of later phases (``arrive_drop``);
    ``no_complete`` never completes the phase (``.noComplete``)."""
    p, e, tx, ph = unpack(w)
    n = counts.size
    states = np.empty(n, np.uint64)
    i = 0
    while i < n:
        if tx_add is not None:
            # each lane adds its transactions just before arriving (arrive.expect_tx: one
            # lane at a time, as a phase may complete between the lanes)
            tx += int(tx_add[i])
            c = int(counts[i])
            p = max(p - c, 0)
            if drop:
                e = max(e - c, 0)
            states[i] = pack(p, e, tx, ph)
            if not no_complete:
                p, e, tx, ph = _complete(p, e, tx, ph)
            i += 1
            continue
        cum = np.cumsum(counts[i:], dtype=np.int64)
        if no_complete or tx != 0:
            k = n - i  # no arrival here can complete the phase
        else:
            hit = np.flatnonzero(cum >= p)
            k = int(hit[0]) + 1 if hit.size else n - i
        pend = np.maximum(p - cum[:k], 0)
        exp = np.maximum(e - cum[:k], 0) if drop else np.full(k, e, np.int64)
        states[i : i + k] = pack(pend, exp, tx, ph)
        p, e = int(pend[-1]), int(exp[-1])
        i += k
        if not no_complete:
            p, e, tx, ph = _complete(p, e, tx, ph)
    return pack(p, e, tx, ph), states


def update_tx(w: int, deltas: np.ndarray) -> int:
    """Transaction-count changes in lane order (``expect_tx`` adds, ``complete_tx``
    subtracts); a phase completes whenever its count comes to zero with nobody pending."""
    p, e, tx, ph = unpack(w)
    if p != 0:  # arrivals still pending: no change of the count can complete the phase
        return pack(p, e, tx + int(deltas.sum()), ph)
    for d in deltas.tolist():
        tx += d
        p, e, tx, ph = _complete(p, e, tx, ph)
    return pack(p, e, tx, ph)
