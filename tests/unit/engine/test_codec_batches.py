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
from crane.wire.batch_flags import EXPECTS_REPLY

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
