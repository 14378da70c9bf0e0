"""Large copies on every path (the call ring's bulk area, the worker's gRPC socket, the
daemon's relay): the same bytes, the same order with other calls, the same errors, and on the
ring a copy that survives its session being parked and restored mid-stream."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from crane.api.ops import OPS_BY_NAME as O
from crane.api.results import CudaError, CUresult
from crane.cli.control_client import ControlClient
from crane.craned.launcher import DaemonProcess
from crane.guest.ring_bulk import BULK_MIN
from crane.guest.session import GuestSession
from crane.wire.ring_bulk import D2H, H2D, STAGED_MAX
from crane.wire.status import MAX_CHUNK
from tests.integration.polling import wait_for

#: A kernel that stores to address 16: an illegal address, a sticky fault.
WILD_PTX = rb"""
.version 7.0
.target sm_80
.address_size 64

.visible .entry wild()
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    mov.u64 %rd1, 16;
    mov.u32 %r1, 7;
    st.global.u32 [%rd1], %r1;
    ret;
}
"""


def _staged(s: GuestSession) -> bool:
    """Whether this session's large copies go through the ring's bulk area."""
    return s._t.path == "ring" and s._t.bulk is not None


@pytest.mark.parametrize(
    ("size", "offset"),
    [
        (BULK_MIN, 0),  # the smallest staged copy
        (MAX_CHUNK + 3, 1),  # two pieces of a read, odd length, unaligned on both ends
        (3 * MAX_CHUNK + 4093, 4095),  # several pieces of a read, the last one short
        (STAGED_MAX[H2D] + (5 << 20) + 1, 64),  # two pieces of an upload; the area wraps
    ],
)
def test_large_copies_arrive_intact(session: GuestSession, size: int, offset: int) -> None:
    assert _staged(session) == (session._t.path == "ring")
    p = session.mem_alloc(size + 2 * 4096)
    session.memset_d8(p, 0xEE, size + 2 * 4096)
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    session.memcpy_htod(p + offset, data)
    out = np.zeros(size, np.uint8)
    assert session.memcpy_dtoh(p + offset, out=out) is None
    assert np.array_equal(out, data)
    # the bytes around the copy are untouched (nothing ran past either end)
    edges = session.memcpy_dtoh(p, offset) + session.memcpy_dtoh(p + offset + size, 4096)
    assert edges == b"\xee" * (offset + 4096)
    # a read that returns bytes, from an offset inside the copy
    assert session.memcpy_dtoh(p + offset + 5, size - 5) == data[5:].tobytes()


def test_large_copies_keep_stream_order_with_other_calls(session: GuestSession) -> None:
    """A memset before an upload is overwritten by it, one after it overwrites it, and a read
    sees every earlier call on its stream."""
    n = 6 << 20
    p = session.mem_alloc(n)
    stream = session.stream_create()
    data = os.urandom(n)
    for _ in range(3):
        session.memset_d8(p, 1, n, stream)
        session.memcpy_htod(p, data, stream)
        session.memset_d8(p + 100, 2, 1000, stream)
        got = session.memcpy_dtoh(p, n, stream)
        assert got[:100] == data[:100] and got[100:1100] == b"\x02" * 1000
        assert got[1100:] == data[1100:]
    session.stream_destroy(stream)


def test_concurrent_threads_and_streams_copy_their_own_bytes(session: GuestSession) -> None:
    """Threads on their own streams interleave large copies: each gets its own bytes back
    (one staged copy streams at a time; the calls of the others keep flowing)."""
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            stream = session.stream_create()
            rng = np.random.default_rng(seed)
            n = (3 << 20) + seed * 4097
            p = session.mem_alloc(n)
            for _ in range(4):
                data = rng.integers(0, 256, n, dtype=np.uint8)
                session.memcpy_htod(p, data, stream)
                session.memset_d8(p, seed, 1, stream)
                got = np.frombuffer(session.memcpy_dtoh(p, n, stream), np.uint8)
                assert got[0] == seed and np.array_equal(got[1:], data[1:])
            session.stream_synchronize(stream)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def test_large_copies_after_a_sticky_fault_fail_with_it(session: GuestSession) -> None:
    """After a kernel's illegal address every copy fails with CUDA_ERROR_ILLEGAL_ADDRESS (the
    worker refuses it; on the ring its bytes are skipped so the stream stays in step), and
    once the context is reset large copies work again."""
    fn = session.module_get_function(session.module_load(WILD_PTX + b"\0"), "wild")
    n = 3 << 20  # one piece: one failed call to report (each piece of a copy reports its own)
    p = session.mem_alloc(n)
    session.synchronize()
    session.launch(fn, grid=(1,), block=(1,), params=[])
    with pytest.raises(CudaError) as e:
        session.synchronize()
    assert e.value.code == CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    session.memcpy_htod(p, bytes(n))  # asynchronous: its error comes at the next wait
    with pytest.raises(CudaError) as e:
        session.memcpy_dtoh(p, n)
    assert e.value.code == CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    session.ctx_reset_primary()
    q = session.mem_alloc(n)
    data = os.urandom(n)
    session.memcpy_htod(q, data)
    assert session.memcpy_dtoh(q, n) == data


def _raw_staged(s: GuestSession, name: str, addr: int, n: int) -> list[int]:
    """Send staged calls the way the guest library does, without its local range check."""
    op = O[name]
    return s._t.enqueue_run(op, [op.pack(addr, n, 0)], ack=True)


def test_staged_calls_outside_every_allocation_fail_and_stay_in_step(
    daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guest that names memory it does not own in staged calls (bypassing its library's
    checks) gets CUDA_ERROR_INVALID_VALUE, the worker skips or zero-fills the bytes, and the
    next copies find their own bytes."""
    monkeypatch.setenv("CRANE_RING", "require")
    with GuestSession(daemon.address, direct=True) as s:
        assert _staged(s)
        bulk = s._t.bulk
        n = 1 << 20
        p = s.mem_alloc(n)
        s.synchronize()
        bad = p + (1 << 30)
        [seq] = _raw_staged(s, "MEMCPY_HTOD_STAGED", bad, n)
        bulk.area.put(H2D, b"\x55" * n, n)
        s._t.wait_done(seq)
        with pytest.raises(CudaError) as e:
            s.synchronize()
        assert e.value.code == CUresult.CUDA_ERROR_INVALID_VALUE
        [seq] = _raw_staged(s, "MEMCPY_DTOH_STAGED", bad, n)
        got = bytearray(b"\xff" * n)
        bulk.area.get(D2H, got, n)
        assert got == bytes(n)  # zeros stand in for what could not be read
        assert s._t.wait(seq).result == CUresult.CUDA_ERROR_INVALID_VALUE
        data = os.urandom(n)
        s.memcpy_htod(p, data)
        assert s.memcpy_dtoh(p, n) == data
        # larger than a staged call may be: refused without touching the bulk area
        [seq] = _raw_staged(s, "MEMCPY_DTOH_STAGED", p, MAX_CHUNK + 1)
        assert s._t.wait(seq).result == CUresult.CUDA_ERROR_INVALID_VALUE
        s.memcpy_htod(p, data[::-1])
        assert s.memcpy_dtoh(p, n) == data[::-1]
    assert "MEMCPY_HTOD_STAGED -> CUDA_ERROR_INVALID_VALUE" in daemon.log_text()


def test_park_and_restore_while_large_copies_stream(
    daemon: DaemonProcess, transport: str, tmp_path: Path
) -> None:
    """A checkpoint with release quiesces the session between two staged copies (never in
    the middle of one); the copy the guest was making is resent with its bytes to the
    restored worker, and every round trip still returns what was written."""
    ckpt = tmp_path / "bulk.ckpt"
    with GuestSession(daemon.address, client="bulk", direct=True) as s:
        n = (9 << 20) + 123
        p = s.mem_alloc(n)
        s.synchronize()
        stop, rounds, errors = threading.Event(), [0], []

        def guest() -> None:
            rng = np.random.default_rng(1)
            try:
                while not stop.is_set():
                    data = rng.integers(0, 256, n, dtype=np.uint8)
                    s.memcpy_htod(p, data)
                    got = np.frombuffer(s.memcpy_dtoh(p, n), np.uint8)
                    if not np.array_equal(got, data):
                        raise AssertionError(f"round {rounds[0]}: the bytes read back differ")
                    rounds[0] += 1
            except Exception as e:  # reported below
                errors.append(e)

        t = threading.Thread(target=guest)
        t.start()
        assert wait_for(lambda: rounds[0] >= 2 or bool(errors), 60)
        with ControlClient(daemon.address, timeout=None) as c:
            assert c.checkpoint(s.session_id, str(ckpt), release=True).state == "parked"
            time.sleep(0.3)  # the guest is now waiting on a staged copy or its answer
            c.restore(str(ckpt))
        before = rounds[0]
        assert wait_for(lambda: rounds[0] >= before + 3 or bool(errors), 60)
        stop.set()
        t.join(60)
        assert not errors, errors
        assert s._t.resumes == 1 and s._t.path == transport


def test_an_upload_returns_once_its_bytes_are_in_the_bulk_area(
    daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asynchronous, as an upload from page-locked memory is on a GPU: with the worker inside
    a kernel that never returns, a copy that fits the bulk area returns at once (the bytes wait
    there for the worker); closing the session then ends the stuck worker without a hang."""
    from tests.integration.stuck import SPIN_PTX

    monkeypatch.setenv("CRANE_RING", "require")
    s = GuestSession(daemon.address, client="async-upload", direct=True)
    assert _staged(s)
    flag = s.mem_alloc(4)
    buf = s.mem_alloc(2 << 20)
    s.memset_d32(flag, 0, 1)
    fn = s.module_get_function(s.module_load(SPIN_PTX.encode() + b"\0"), "spin")
    s.synchronize()
    s.launch(fn, grid=(1,), block=(32,), params=[flag])
    s._t.flush()
    t0 = time.monotonic()
    s.memcpy_htod(buf, os.urandom(2 << 20))  # the worker is spinning: it reads nothing
    assert time.monotonic() - t0 < 2
    s._t.close()
    with ControlClient(daemon.address) as ctl:
        assert wait_for(lambda: not ctl.sessions().sessions, 30)
