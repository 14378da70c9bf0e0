"""The guest's queue of packed calls (crane.guest.callq): the C queue and the Python one give
the same answers (records, sequence numbers, refusals) for the same calls, number plain and
packed calls in one order, and lose or repeat nothing when threads put at once."""

from __future__ import annotations

import threading

import pytest

from crane.api.ops import OPS_BY_NAME as O
from crane.guest import callq
from crane.guest.callq import ATTENTION, FULL, NOT_SERVED, TOO_WIDE, CQueue, PyQueue
from crane.wire import packed
from crane.wire.packed import record_struct

needs_c = pytest.mark.skipif(callq.lib is None, reason="the call queue's C is not built")
MEMSET, RECORD_EV, CREATE = O["MEMSET"], O["EVENT_RECORD"], O["STREAM_CREATE"]


def _script(q: CQueue | PyQueue) -> list[object]:
    """What a queue answers to a fixed series of calls."""
    out: list[object] = []
    out.append(q.put(MEMSET.id, 0x1000, 7, 1, 16, 0))
    out.append(q.put(RECORD_EV.id, 0x0300_0000_0000_0001, 2, 0, 0, 0))
    out.append(q.next_seq())  # a plain call between them
    out.append(q.put(MEMSET.id, 0x2000, 1 << 32, 1, 1, 0))  # value wider than its u32
    out.append(q.put(CREATE.id, 1, 2, 0, 0, 0))  # a signed argument: not served
    out.append(q.put(O["STREAM_SYNCHRONIZE"].id, 0, 0, 0, 0, 0))  # not packed at all
    out.append(q.put(999, 0, 0, 0, 0, 0))
    q.attend(True)
    out.append(q.put(MEMSET.id, 0x1000, 1, 1, 1, 0))
    q.attend(False)
    out.append(q.put(MEMSET.id, 0x3000, 0xFFFFFFFF, 4, (1 << 64) - 1, 2))
    out.append(q.count())
    out.append(q.take())
    out.append(q.take())
    for i in range(q.cap):
        q.put(RECORD_EV.id, i, 0, 0, 0, 0)
    out.append(q.put(RECORD_EV.id, 0, 0, 0, 0, 0))
    recs, last = q.take()
    out.append((len(recs), last, q.count()))
    return out


@needs_c
def test_the_c_queue_answers_as_the_python_one() -> None:
    assert _script(CQueue(8)) == _script(PyQueue(8))


def test_records_are_the_packed_layout_numbered_with_the_plain_calls() -> None:
    for q in [PyQueue(8)] + ([CQueue(8)] if callq.lib is not None else []):
        got = _script(q)
        assert got[:10] == [1, 2, 3, TOO_WIDE, NOT_SERVED, NOT_SERVED, NOT_SERVED, ATTENTION, 3, 3]
        recs, last = got[10]  # type: ignore[misc]
        assert recs == (
            record_struct(MEMSET).pack(1, MEMSET.id, 0x1000, 7, 1, 16, 0)
            + record_struct(RECORD_EV).pack(2, RECORD_EV.id, 0x0300_0000_0000_0001, 2)
            + record_struct(MEMSET).pack(4, MEMSET.id, 0x3000, 0xFFFFFFFF, 4, (1 << 64) - 1, 2)
        )
        assert last == 4 and got[11] == (b"", 0)
        assert got[12] == FULL and got[13] == (8 * packed.RECORD, 12, 0)


@pytest.mark.parametrize("kind", ["c", "py"])
def test_threads_putting_at_once_lose_and_repeat_nothing(kind: str) -> None:
    if kind == "c" and callq.lib is None:
        pytest.skip("the call queue's C is not built")
    q = CQueue(64) if kind == "c" else PyQueue(64)
    taken: list[tuple[int, int]] = []  # (seq, the putting thread's value)
    plain: list[int] = []
    lock = threading.Lock()

    def drain() -> None:
        with lock:  # (one drain at a time, as the transport's lock makes it)
            recs, _ = q.take()
            taken.extend(
                (s, int.from_bytes(r[16:24], "little")) for s, _, r in packed.records(recs)
            )

    def work(t: int) -> None:
        for i in range(2000):
            while q.put(RECORD_EV.id, t * 10000 + i, 0, 0, 0, 0) == FULL:
                drain()
            if i % 100 == 0:
                with lock:
                    plain.append(q.next_seq())

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    drain()
    seqs = [s for s, _ in taken]
    assert sorted(seqs + plain) == list(range(1, 8000 + len(plain) + 1))
    assert seqs == sorted(seqs)  # records leave in the order they were numbered
    for t in range(4):  # and each thread's calls in the order it made them
        mine = [v for _, v in taken if v // 10000 == t]
        assert mine == [t * 10000 + i for i in range(2000)]
