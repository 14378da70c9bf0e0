"""Packed calls (``CallBatch.packed``) run exactly as the same calls sent as plain ``Call``
messages: the same device memory, answers (seqs, codes, messages), ``done_seq``, call counts,
dirty allocations and accounting; runs of memsets go through the simulator's run handler (a C
loop) and every call it cannot vouch for through the single path. Each test runs one
sequence of calls both ways on two engines and compares everything the guest or a checkpoint
could see. The packed side also packs the synchronizing calls that travel as records and
asks for short answers (``ReplyBatch.answer``), read back here as the messages they stand
for."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from crane.api.generated.cuda_enums import CUresult
from crane.api.ops import OPS_BY_NAME as O
from crane.api.results import CudaError
from crane.backends.factory import make_backend
from crane.backends.sim.memory import SimMemory
from crane.device.layout import WINDOW_SIZE, window_base
from crane.engine.codec import RUN_MIN
from crane.engine.engine import Engine
from crane.modules.store import ImageStore
from crane.v1 import guest_pb2
from crane.wire.batch_flags import EXPECTS_REPLY, SHORT_ANSWER
from crane.wire.packed import RECORD, RECORD_OPS, record_struct
from crane.wire.replies import as_message

CTX = 0x0100_0000_0000_0001
EVENT = 0x0300_0000_0000_0001
STREAM = 0x0200_0000_0000_0001
A_SIZE = 4096


def _engine(tmp: Path) -> Engine:
    window = (window_base(3), WINDOW_SIZE)
    backend = make_backend("sim", "l4", window, b"seed", str(tmp / "ledger"), 3)
    e = Engine.create(backend, "s1", window, ImageStore(tmp))
    base = window[0]
    setup = [
        (1, "CTX_CREATE", (CTX, 0)),
        (2, "MEM_MAP_CHUNK", (base, 2 << 20)),
        (3, "MEM_ALLOC", (CTX, base, A_SIZE)),
        (4, "MEM_ALLOC", (CTX, base + 2 * A_SIZE, A_SIZE)),
        (5, "EVENT_CREATE", (CTX, EVENT, 0)),
        (6, "STREAM_CREATE", (CTX, STREAM, 0, 0)),
    ]
    for call in setup:
        e.run_batch(_batch([call], packed=False, expects=True))
    e.device.dirty.mark()
    return e


@pytest.fixture
def engines(tmp_path: Path) -> tuple[Engine, Engine]:
    """(plain, packed): the same session twice."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    return _engine(tmp_path / "a"), _engine(tmp_path / "b")


def _batch(
    calls: list[tuple[int, str | int, tuple]], packed: bool, expects: bool, short: bool = False
) -> bytes:
    """A batch of ``(seq, op, args)``; ``packed``: the ones that may travel as records so (an
    int op: a raw record of that id, or an empty plain call); ``short``: short answers."""
    b = guest_pb2.CallBatch(flags=(EXPECTS_REPLY if expects else 0) | (SHORT_ANSWER * short))
    recs = bytearray()
    for seq, op, args in calls:
        if isinstance(op, int):
            if packed:
                recs += seq.to_bytes(8, "little") + op.to_bytes(4, "little") + bytes(52)
            else:
                b.calls.add(seq=seq, op=op, args=b"")
        elif packed and O[op].id in RECORD_OPS:
            recs += record_struct(O[op]).pack(seq, O[op].id, *args)
        else:
            b.calls.add(seq=seq, op=O[op].id, args=O[op].pack(*args))
    b.packed = bytes(recs)
    return b.SerializeToString()


def _seen(e: Engine, msgs: list[bytes]) -> tuple:
    """What the guest and a checkpoint see of a batch's run."""
    replies = [as_message(m) for m in msgs]
    base = e.device.window[0]
    meter = e.meter
    assert meter is not None
    counts = {o: sum(meter.hist[o.id]) for o in (O["MEMSET"], O["EVENT_RECORD"])}
    return (
        [([(r.seq, r.result, r.detail) for r in rb.replies], rb.done_seq) for rb in replies],
        e.log.done_seq,
        e.log.calls,
        bytes(e.device.read(base, A_SIZE)) + bytes(e.device.read(base + 2 * A_SIZE, A_SIZE)),
        e.device.dirty.mark(),
        counts,
    )


def _both(engines: tuple[Engine, Engine], calls: list, expects: bool = True) -> tuple:
    plain, packed = engines
    a = _seen(plain, plain.run_batch(_batch(calls, packed=False, expects=expects)))
    b = _seen(packed, packed.run_batch(_batch(calls, packed=True, expects=expects, short=True)))
    assert b == a
    return a


def _memsets(base: int, n: int, seq: int, rng: random.Random) -> list:
    out = []
    for i in range(n):
        elem = rng.choice((1, 2, 4))
        count = rng.randrange(0, 64 // elem)
        at = base + rng.randrange(0, A_SIZE - elem * count + 1) // elem * elem
        out.append((seq + i, "MEMSET", (at, rng.randrange(1 << 32), elem, count, 0)))
    return out


def test_a_run_of_overlapping_memsets_lands_as_one_by_one(
    engines: tuple[Engine, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = engines[0].device.window[0]
    rng = random.Random(7)
    calls = _memsets(base, 300, 10, rng) + _memsets(base + 2 * A_SIZE, 300, 310, rng)
    packed = engines[1]
    single = []  # the packed engine's memsets run by the run handler, none one by one
    monkeypatch.setattr(packed.device.backend, "memset", lambda *a: single.append(a))
    replies, done, _, memory, *_ = _both(engines, [*calls, (610, "STREAM_SYNCHRONIZE", (0,))])
    assert replies == [([(610, 0, "")], 610)] and done == 610
    assert not single and memory.count(0) < len(memory) // 2


def test_bad_calls_inside_a_run_fail_alone_with_the_single_path_s_answers(
    engines: tuple[Engine, Engine],
) -> None:
    base = engines[0].device.window[0]
    rng = random.Random(8)
    calls = _memsets(base, 40, 10, rng)
    calls[3] = (13, "MEMSET", (base + A_SIZE - 2, 1, 1, 4, 0))  # runs past its allocation
    calls[4] = (14, "MEMSET", (base + A_SIZE + 8, 1, 1, 1, 0))  # between allocations
    calls[20] = (30, "MEMSET", (base, 1, 3, 1, 0))  # no such element size
    calls[21] = (31, "MEMSET", (base, 1, 1, 1, 0x0200_0000_0000_0077))  # unknown stream
    calls[22] = (32, "MEMSET", (base, 1, 1, 1, STREAM))  # another stream: a cut, no error
    calls[30] = (40, "MEMSET", (base, 1, 1, 1 << 62, 0))  # elem * count past 2**64
    replies, *_ = _both(engines, [*calls, (50, "STREAM_SYNCHRONIZE", (0,))])
    ((answers, _),) = replies
    assert [(s, r) for s, r, _ in answers] == [
        (13, CUresult.CUDA_ERROR_INVALID_VALUE),
        (14, CUresult.CUDA_ERROR_INVALID_VALUE),
        (30, CUresult.CUDA_ERROR_INVALID_VALUE),
        (31, CUresult.CUDA_ERROR_INVALID_HANDLE),
        (40, CUresult.CUDA_ERROR_INVALID_VALUE),
        (50, 0),
    ]


def test_packed_and_plain_calls_of_one_batch_run_in_seq_order(
    engines: tuple[Engine, Engine],
) -> None:
    base = engines[0].device.window[0]
    rng = random.Random(9)
    calls = _memsets(base, 20, 10, rng)
    calls += [(30, "MEMCPY_HTOD", (base + 5, 0)), (31, "EVENT_RECORD", (EVENT, STREAM))]
    calls += _memsets(base, 20, 32, rng)
    calls += [(52, "STREAM_WAIT_EVENT", (0, EVENT, 0)), (53, "EVENT_RECORD", (EVENT, 0))]
    # MEMCPY_HTOD's data is not set by _batch (args only): a plain call with no bytes copies
    # none, so what is compared is the order of everything else
    replies, *_ = _both(engines, [*calls, (54, "CTX_SYNCHRONIZE", (CTX,))])
    assert replies == [([(54, 0, "")], 54)]


def test_after_a_sticky_fault_packed_calls_are_refused_and_teardown_runs(
    engines: tuple[Engine, Engine],
) -> None:
    base = engines[0].device.window[0]
    for e in engines:
        e.device.sticky = CudaError(CUresult.CUDA_ERROR_ILLEGAL_ADDRESS, "a kernel faulted")
    calls = _memsets(base, 2 * RUN_MIN, 10, random.Random(1))
    calls += [(10 + 2 * RUN_MIN, "EVENT_DESTROY", (EVENT,))]
    replies, *_ = _both(engines, calls, expects=False)
    ((answers, _),) = replies
    assert [r for _, r, _ in answers] == [CUresult.CUDA_ERROR_ILLEGAL_ADDRESS] * (2 * RUN_MIN)
    for e in engines:
        assert EVENT not in e.device.events  # the teardown call ran


def test_packed_calls_that_ran_before_are_skipped_and_a_whole_resend_answered_again(
    engines: tuple[Engine, Engine],
) -> None:
    base = engines[0].device.window[0]
    first = [(10 + i, "MEMSET", (base + i, 1, 1, 1, 0)) for i in range(RUN_MIN * 2)]
    _both(engines, [*first, (26, "STREAM_SYNCHRONIZE", (0,))])
    # resent with new calls after it: only those run (the old ones would write 2)
    again = [(10 + i, "MEMSET", (base + i, 2, 1, 1, 0)) for i in range(RUN_MIN * 2)]
    fresh = [(27 + i, "MEMSET", (base + 100 + i, 3, 1, 1, 0)) for i in range(RUN_MIN)]
    *_, memory, _, _ = _both(engines, [*again, (26, "STREAM_SYNCHRONIZE", (0,)), *fresh])
    assert memory[: 2 * RUN_MIN] == b"\x01" * 2 * RUN_MIN
    assert memory[100 : 100 + RUN_MIN] == b"\x03" * RUN_MIN
    # all of it ran: the last answer again, nothing runs
    last = [(27 + i, "MEMSET", (base + 100 + i, 4, 1, 1, 0)) for i in range(RUN_MIN)]
    plain, packed = engines
    a = plain.run_batch(_batch(last, packed=False, expects=True))
    b = packed.run_batch(_batch(last, packed=True, expects=True))
    assert a == b and guest_pb2.ReplyBatch.FromString(b[-1]).done_seq == 26 + RUN_MIN
    assert _seen(packed, [])[3] == _seen(plain, [])[3]


def test_an_unknown_or_unpackable_op_in_the_records_fails_alone(
    engines: tuple[Engine, Engine], caplog: pytest.LogCaptureFixture
) -> None:
    _, packed = engines
    read_id = O["MEMCPY_DTOH"].id  # answers with bytes: never a record
    calls = [(10, 999, ()), (11, read_id, ()), (12, "EVENT_RECORD", (EVENT, 0))]
    msgs = packed.run_batch(_batch(calls, packed=True, expects=False))
    (rb,) = [guest_pb2.ReplyBatch.FromString(m) for m in msgs]
    assert [(r.seq, r.result) for r in rb.replies] == [
        (10, CUresult.CUDA_ERROR_NOT_SUPPORTED),
        (11, CUresult.CUDA_ERROR_NOT_SUPPORTED),
    ]
    assert "unknown op 999" in rb.replies[0].detail
    assert "MEMCPY_DTOH cannot travel packed" in rb.replies[1].detail
    assert rb.done_seq == 12 and "cannot travel packed" in caplog.text


@pytest.mark.parametrize(
    "packed, why",
    [(b"\x00" * (RECORD + 1), "not 64-byte records"), (b"", "ascending")],
)
def test_malformed_records_refuse_the_batch_with_a_log_line(
    engines: tuple[Engine, Engine], caplog: pytest.LogCaptureFixture, packed: bytes, why: str
) -> None:
    _, e = engines
    if not packed:  # two records out of order
        rec = record_struct(O["EVENT_RECORD"])
        packed = rec.pack(11, O["EVENT_RECORD"].id, EVENT, 0) + rec.pack(
            10, O["EVENT_RECORD"].id, EVENT, 0
        )
    raw = guest_pb2.CallBatch(flags=EXPECTS_REPLY, packed=packed).SerializeToString()
    (rb,) = [guest_pb2.ReplyBatch.FromString(m) for m in e.run_batch(raw)]
    ((seq, code),) = [(r.seq, r.result) for r in rb.replies]
    assert (seq, code) == (0, CUresult.CUDA_ERROR_INVALID_VALUE) and why in rb.replies[0].detail
    assert "malformed call batch" in caplog.text and e.log.done_seq == 6


def test_fill_run_matches_fills_one_by_one() -> None:
    base = 1 << 40
    a, b = SimMemory(base, 2 << 20), SimMemory(base, 2 << 20)
    for m in (a, b):
        m.map_chunk(base, 2 << 20)
        m.alloc(base, 1 << 16)
    rng = np.random.default_rng(3)
    n = 500
    elem = rng.choice(np.array([1, 2, 4], np.uint32), n)
    count = rng.integers(0, 300, n).astype(np.uint64)
    addrs = (base + rng.integers(0, (1 << 16) - 1200, n) // elem * elem).astype(np.uint64)
    values = rng.integers(0, 1 << 32, n).astype(np.uint32)
    addrs[n - 10] = base + (1 << 16) - 1  # runs past the allocation: stops there
    count[n - 10] = 2
    elem[n - 10] = 1
    assert a.fill_run(addrs, values, elem, count) == n - 10
    for i in range(n - 10):
        b.fill(int(addrs[i]), int(values[i]), int(elem[i]), int(count[i]))
    assert a.read(base, 1 << 16) == b.read(base, 1 << 16)
