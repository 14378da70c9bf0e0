"""The ring's small-call hot path under the conditions its shortcuts must survive: several
threads of one guest sharing the reply stream (one reads, the others wait and are woken only
when someone waits), calls in flight from all of them, and an asynchronous failure raised at
the next synchronizing call of whichever thread makes it; each on both same-host transports."""

from __future__ import annotations

import threading

import pytest

from crane.api.ops import OPS_BY_NAME as O
from crane.api.results import CudaError, CUresult
from crane.craned.launcher import DaemonProcess
from crane.guest import transport as transport_mod
from crane.guest.session import GuestSession
from crane.wire import packed
from crane.wire import ring as wring

pytestmark = pytest.mark.skipif(bool(wring.available()), reason=wring.available() or "")

THREADS = 6
ROUNDS = 150


def test_threads_sharing_a_session_all_get_their_answers(
    daemon: DaemonProcess, transport: str
) -> None:
    with GuestSession(daemon.address, direct=True) as s:
        assert s._t.path == transport
        size = 4096
        p = s.mem_alloc(size * THREADS)
        s.synchronize()
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                stream = s.stream_create()
                for r in range(ROUNDS):
                    s.memset_d8(p + i * size, (i + r) & 0xFF, size, stream)
                    s.stream_synchronize(stream)
                    if r % 25 == 0:
                        assert s.stream_query(stream)
                s.stream_destroy(stream)
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a thread never got its answer"
        assert errors == []
        got = s.memcpy_dtoh(p, size * THREADS)
        for i in range(THREADS):
            assert bytes(got[i * size : (i + 1) * size]) == bytes([(i + ROUNDS - 1) & 0xFF]) * size


def test_an_async_failure_is_raised_once_at_the_next_synchronizing_call(
    daemon: DaemonProcess, transport: str
) -> None:
    with GuestSession(daemon.address, direct=True) as s:
        p = s.mem_alloc(1 << 20)
        e = s.event_create()
        s.synchronize()
        # the guest checks the handle; the worker finds the event gone: an asynchronous error
        wait = O["STREAM_WAIT_EVENT"]
        s._t.enqueue(wait, wait.pack(0, e + 1, 0), expect=False)
        for i in range(100):  # later asynchronous calls still run
            s.memset_d8(p + i, i, 1)
        with pytest.raises(CudaError) as err:
            s.synchronize()
        assert err.value.code == CUresult.CUDA_ERROR_INVALID_HANDLE
        s.synchronize()  # raised once
        assert bytes(s.memcpy_dtoh(p, 100)) == bytes(range(100))


def test_small_asynchronous_calls_travel_packed_in_their_place(
    daemon: DaemonProcess, transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memsets and event records go as records of the batch (crane.wire.packed), the copy
    with bytes as a Call, and the worker runs them all in the order they were made."""
    # one batch, sent by the flush below: the flush timer (1 ms after a batch's first call)
    # split it once on a loaded machine, the loop preempted for longer than that
    monkeypatch.setattr(transport_mod, "FLUSH_AFTER_S", 60.0)
    with GuestSession(daemon.address, direct=True) as s:
        p = s.mem_alloc(4096)
        e = s.event_create()
        s.synchronize()
        for i in range(20):  # a run, then one overwritten by the copy, then one over the copy
            s.memset_d8(p + i, i + 1, 1)
        s.event_record(e)
        s.memcpy_htod(p + 5, b"\xaa\xbb")
        s.memset_d8(p + 6, 0xCC, 1)
        s._t.flush()
        batch = s._t._unacked[-1][2]
        assert [c.op for c in batch.calls] == [O["MEMCPY_HTOD"].id]
        ops = [op for _, op, _ in packed.records(batch.packed)]
        assert ops == [O["MEMSET"].id] * 20 + [O["EVENT_RECORD"].id, O["MEMSET"].id]
        s.synchronize()
        want = bytearray(range(1, 21))
        want[5:7] = b"\xaa\xcc"
        assert bytes(s.memcpy_dtoh(p, 20)) == bytes(want)


def test_memsets_wait_for_an_acknowledgement_when_too_much_is_unacknowledged(
    daemon: DaemonProcess, transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guest keeps what it sent until the worker says it ran (a resume resends it); past
    MAX_UNACKED_BYTES it asks for an acknowledgement and waits, the queued memsets too."""
    monkeypatch.setattr(transport_mod, "MAX_UNACKED_BYTES", 200_000)
    with GuestSession(daemon.address, direct=True) as s:
        p = s.mem_alloc(4096)
        s.synchronize()
        most = 0
        for i in range(20_000):
            s.memset_d8(p + (i & 4095), i & 0xFF, 1)
            if i % 500 == 0:
                most = max(most, s._t._unacked_bytes)
        s.synchronize()
        # at most the limit and the batches sent while the acknowledgement was on its way
        assert 0 < most <= 200_000 + 2 * 1024 * 96
        want = bytearray(4096)
        for i in range(20_000):
            want[i & 4095] = i & 0xFF
        assert bytes(s.memcpy_dtoh(p, 4096)) == bytes(want)


@pytest.mark.parametrize("path", ["ring", "direct", "relay"])
def test_synchronizing_calls_travel_as_records_and_come_back_short(
    daemon: DaemonProcess, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A synchronize goes as a record after the records queued before it, in a batch written
    by hand when no plain call waits (among the plain calls otherwise), and the worker's
    answer is the short one, on every path; what ran before it ran, in order."""
    monkeypatch.setenv("CRANE_RING", "require" if path == "ring" else "0")
    answers: list[object] = []
    real = transport_mod.decode_answer
    monkeypatch.setattr(transport_mod, "decode_answer", lambda raw: _kept(answers, real(raw)))
    with GuestSession(daemon.address, direct=path != "relay") as s:
        assert s._t.path == path
        sent: list[object] = []
        send = s._t._send_locked
        monkeypatch.setattr(s._t, "_send_locked", lambda b, *a: (sent.append(b), send(b, *a)))
        p = s.mem_alloc(4096)
        stream = s.stream_create()
        s.synchronize()
        s.memset_d8(p, 7, 16, stream)
        sent.clear()
        answers.clear()
        s.stream_synchronize(stream)
        (raw,) = sent
        assert isinstance(raw, bytes)
        recs = packed.records_only(raw)
        assert recs is not None
        (_, memset, _), (seq, sync, _) = packed.records(recs)
        assert (memset, sync) == (O["MEMSET"].id, O["STREAM_SYNCHRONIZE"].id)
        assert answers == [(seq, seq, 0, b"")]  # (seq, done_seq, result, results)
        # a query's answer is short too; one after a plain call goes with it in its message
        assert s.stream_query(stream)
        s.memcpy_htod(p + 16, b"\x09" * 16)
        sent.clear()
        free, total = s.mem_get_info()
        (batch,) = sent
        assert [c.op for c in batch.calls] == [O["MEMCPY_HTOD"].id]  # type: ignore[attr-defined]
        assert [op for _, op, _ in packed.records(batch.packed)] == [O["MEM_GET_INFO"].id]  # type: ignore[attr-defined]
        assert 0 < free <= total and answers[-1] is not None
        assert bytes(s.memcpy_dtoh(p, 32)) == b"\x07" * 16 + b"\x09" * 16


def _kept(answers: list[object], answer: object) -> object:
    answers.append(answer)
    return answer
