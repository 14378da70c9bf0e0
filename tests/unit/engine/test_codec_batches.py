"""The worker's codec on whole batches: which calls of a batch run (a batch resent after a
resume carries calls that ran already), what a synchronizing call's answer holds, and that an
unknown op fails alone. The ring's hot path takes shortcuts here (calls skipped in place, a
success added straight to the reply batch), so these pin what the shortcuts must keep."""

from __future__ import annotations

from pathlib import Path

import pytest

from crane.api.generated.cuda_enums import CUresult
from crane.api.ops import OPS_BY_NAME as O
from crane.backends.factory import make_backend
from crane.device.layout import WINDOW_SIZE, window_base
from crane.engine.engine import Engine
from crane.modules.store import ImageStore
from crane.v1 import guest_pb2
from crane.wire.batch_flags import EXPECTS_REPLY, SHORT_ANSWER
from crane.wire.packed import encode_batch, record_struct, records_only
from crane.wire.replies import decode_answer, encode_answer

CTX = 0x0100_0000_0000_0001


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    window = (window_base(3), WINDOW_SIZE)
    backend = make_backend("sim", "l4", window, b"seed", str(tmp_path / "ledger"), 3)
    e = Engine.create(backend, "s1", window, ImageStore(tmp_path))
    base = window[0]
    _run(e, [(1, "CTX_CREATE", (CTX, 0))])
    _run(e, [(2, "MEM_MAP_CHUNK", (base, 2 << 20))], expects=True)
    _run(e, [(3, "MEM_ALLOC", (CTX, base, 4096))])
    return e


def _batch(calls: list[tuple[int, str | int, tuple]], expects: bool) -> bytes:
    b = guest_pb2.CallBatch(flags=EXPECTS_REPLY if expects else 0)
    for seq, op, args in calls:
        if isinstance(op, str):
            b.calls.add(seq=seq, op=O[op].id, args=O[op].pack(*args))
        else:
            b.calls.add(seq=seq, op=op, args=b"")
    return b.SerializeToString()


def _run(e: Engine, calls: list, expects: bool = False) -> list[guest_pb2.ReplyBatch]:
    return [guest_pb2.ReplyBatch.FromString(m) for m in e.run_batch(_batch(calls, expects))]


def _read(e: Engine, seq: int, n: int) -> bytes:
    (rb,) = _run(e, [(seq, "MEMCPY_DTOH", (e.device.window[0], n, 0))], expects=True)
    (r,) = rb.replies
    assert (r.seq, r.result) == (seq, 0), r.detail
    return r.data


def test_a_synchronizing_call_is_answered_with_its_seq_and_done_seq(engine: Engine) -> None:
    (rb,) = _run(engine, [(4, "STREAM_SYNCHRONIZE", (0,))], expects=True)
    assert rb.done_seq == 4
    assert [(r.seq, r.result, r.out, r.data, r.detail) for r in rb.replies] == [
        (4, 0, b"", b"", "")
    ]


def test_async_calls_that_succeed_get_no_answer(engine: Engine) -> None:
    base = engine.device.window[0]
    assert (
        _run(engine, [(4, "MEMSET", (base, 7, 1, 16, 0)), (5, "MEMSET", (base, 9, 1, 8, 0))]) == []
    )
    assert engine.log.done_seq == 5
    assert _read(engine, 6, 16) == bytes([9] * 8 + [7] * 8)


def test_calls_of_a_resent_batch_that_ran_before_do_not_run_again(engine: Engine) -> None:
    base = engine.device.window[0]
    _run(engine, [(4, "MEMSET", (base, 1, 1, 4, 0))])
    calls_before = engine.log.calls
    # the guest resends 4 (it never saw it acknowledged) with 5 after it: only 5 runs, so the
    # bytes 4 would now write (2) never land
    (rb,) = _run(
        engine,
        [(4, "MEMSET", (base, 2, 1, 4, 0)), (5, "MEMSET", (base + 2, 3, 1, 1, 0)),
         (6, "STREAM_SYNCHRONIZE", (0,))],
        expects=True,
    )  # fmt: skip
    assert [r.seq for r in rb.replies] == [6] and rb.done_seq == 6
    assert engine.log.calls == calls_before + 2
    assert _read(engine, 7, 4) == bytes([1, 1, 3, 1])


def test_a_batch_that_ran_whole_is_answered_again_not_run(engine: Engine) -> None:
    base = engine.device.window[0]
    first = engine.run_batch(
        _batch([(4, "MEMSET", (base, 5, 1, 1, 0)), (5, "STREAM_SYNCHRONIZE", (0,))], True)
    )
    again = engine.run_batch(
        _batch([(4, "MEMSET", (base, 6, 1, 1, 0)), (5, "STREAM_SYNCHRONIZE", (0,))], True)
    )
    assert again[:-1] == first  # the last answer again, then where the session stands
    tail = guest_pb2.ReplyBatch.FromString(again[-1])
    assert tail.done_seq == 5 and not tail.replies
    assert _read(engine, 6, 1) == b"\x05"


def test_calls_out_of_order_run_only_above_done_seq(engine: Engine) -> None:
    base = engine.device.window[0]
    _run(engine, [(9, "STREAM_SYNCHRONIZE", (0,))], expects=True)
    # a batch whose first call is stale but a later one fresh: the later one runs
    (rb,) = _run(
        engine,
        [(8, "MEMSET", (base, 4, 1, 1, 0)), (10, "MEMSET", (base + 1, 8, 1, 1, 0)),
         (11, "STREAM_SYNCHRONIZE", (0,))],
        expects=True,
    )  # fmt: skip
    assert [r.seq for r in rb.replies] == [11]
    assert _read(engine, 12, 2) == b"\x00\x08"


def test_an_unknown_op_fails_alone_and_the_batch_goes_on(engine: Engine) -> None:
    (rb,) = _run(engine, [(4, 999, ()), (5, "STREAM_SYNCHRONIZE", (0,))], expects=True)
    assert [(r.seq, r.result) for r in rb.replies] == [
        (4, CUresult.CUDA_ERROR_NOT_SUPPORTED),
        (5, 0),
    ]
    assert "unknown op 999" in rb.replies[0].detail and rb.done_seq == 5


def test_a_call_with_results_carries_them(engine: Engine) -> None:
    (rb,) = _run(engine, [(4, "MEM_GET_INFO", ())], expects=True)
    (r,) = rb.replies
    free, total = O["MEM_GET_INFO"].unpack_results(r.out)
    assert r.result == 0 and 0 < free <= total


# ---- synchronizing calls as records, short answers ---------------------------------------------
SYNC_FLAGS = EXPECTS_REPLY | SHORT_ANSWER


def _records(calls: list[tuple[int, str, tuple]], flags: int = SYNC_FLAGS) -> bytes:
    """A batch of records only, as the guest writes it for a synchronizing call."""
    return encode_batch(
        flags, b"".join(record_struct(O[op]).pack(s, O[op].id, *a) for s, op, a in calls)
    )


def test_a_synchronizing_record_gets_the_short_answer_the_guest_asked_for(engine: Engine) -> None:
    raw = _records([(4, "STREAM_SYNCHRONIZE", (0,))])
    assert records_only(raw) is not None  # (no message is parsed for it)
    (msg,) = engine.run_batch(raw)
    assert msg == encode_answer(4, 0, b"", 4) and decode_answer(msg) == (4, 4, 0, b"")
    # what any protobuf parser reads in it: the answer and nothing else
    rb = guest_pb2.ReplyBatch.FromString(msg)
    assert rb.answer == msg[2:] and not rb.replies and not rb.done_seq and not rb.stdout
    # a guest that does not ask for it gets the message, as for the call sent as a Call
    (plain,) = engine.run_batch(_records([(5, "STREAM_SYNCHRONIZE", (0,))], EXPECTS_REPLY))
    rb = guest_pb2.ReplyBatch.FromString(plain)
    assert [(r.seq, r.result) for r in rb.replies] == [(5, 0)] and rb.done_seq == 5
    assert not rb.answer


def test_a_short_answer_carries_the_op_s_results(engine: Engine) -> None:
    (msg,) = engine.run_batch(_records([(4, "MEM_GET_INFO", ())]))
    seq, done, result, out = decode_answer(msg) or (0, 0, -1, b"")
    (rb,) = _run(engine, [(5, "MEM_GET_INFO", ())], expects=True)
    assert (seq, done, result) == (4, 4, 0) and out == rb.replies[0].out


def test_anything_more_than_one_plain_answer_goes_as_the_message(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = engine.device.window[0]
    # a failure carries its detail (and the sticky rule's answers are failures too)
    (msg,) = engine.run_batch(_records([(4, "STREAM_SYNCHRONIZE", (0x0200_0000_0000_0077,))]))
    (r,) = guest_pb2.ReplyBatch.FromString(msg).replies
    assert r.result == CUresult.CUDA_ERROR_INVALID_HANDLE and "stream" in r.detail
    # an asynchronous call's failure before it: both, in seq order (the guest raises the first)
    bad_memset = (5, "MEMSET", (base + 8192, 1, 1, 1, 0))
    (msg,) = engine.run_batch(_records([bad_memset, (6, "STREAM_SYNCHRONIZE", (0,))]))
    rb = guest_pb2.ReplyBatch.FromString(msg)
    assert [(r.seq, r.result) for r in rb.replies] == [
        (5, CUresult.CUDA_ERROR_INVALID_VALUE),
        (6, 0),
    ]
    assert rb.done_seq == 6 and not rb.answer
    # two answers
    (msg,) = engine.run_batch(_records([(7, "MEM_GET_INFO", ()), (8, "STREAM_SYNCHRONIZE", (0,))]))
    assert [r.seq for r in guest_pb2.ReplyBatch.FromString(msg).replies] == [7, 8]
    # a kernel's output since the last message
    monkeypatch.setattr(engine.codec, "take_stdout", lambda: b"printf\n")
    (msg,) = engine.run_batch(_records([(9, "STREAM_SYNCHRONIZE", (0,))]))
    rb = guest_pb2.ReplyBatch.FromString(msg)
    assert rb.stdout == b"printf\n" and [r.seq for r in rb.replies] == [9] and rb.done_seq == 9


def test_a_resent_record_batch_that_ran_is_answered_again(engine: Engine) -> None:
    base = engine.device.window[0]
    calls = [(4, "MEMSET", (base, 5, 1, 1, 0)), (5, "STREAM_SYNCHRONIZE", (0,))]
    first = engine.run_batch(_records(calls))
    calls[0] = (4, "MEMSET", (base, 6, 1, 1, 0))
    again = engine.run_batch(_records(calls))
    assert first == [encode_answer(5, 0, b"", 5)] and again[:-1] == first
    assert guest_pb2.ReplyBatch.FromString(again[-1]).done_seq == 5
    assert _read(engine, 6, 1) == b"\x05"
