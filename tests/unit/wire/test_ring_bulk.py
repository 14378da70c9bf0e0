"""The bulk area's core: bytes stream through a FIFO smaller than the transfer in order (one
process copying in while another copies out), discards and zero fills keep both sides in step,
closing ends every wait, a dead peer is noticed, and a corrupt FIFO is refused."""

from __future__ import annotations

import mmap
import multiprocessing
import os
import struct
import threading
import time

import pytest

from crane.wire import ring_bulk as bmod
from crane.wire.ring import RingClosed
from crane.wire.ring_bulk import D2H, H2D, BulkArea

pytestmark = pytest.mark.skipif(bool(bmod.bulk_available()), reason=bmod.bulk_available() or "")

CAP = 1 << 20  # the smallest multiple of the C core's step that makes the FIFO wrap often


def _pair(alive=lambda: True) -> tuple[BulkArea, BulkArea]:
    fd = BulkArea.create(CAP)
    try:
        return BulkArea(fd, alive), BulkArea(fd, alive)
    finally:
        os.close(fd)


def _echo(fd: int, sizes: list[int]) -> None:
    """Another process: read each transfer from H2D and write it back on D2H."""
    area = BulkArea(fd, lambda: True)
    for n in sizes:
        buf = bytearray(n)
        area.get(H2D, buf, n)
        area.put(D2H, buf, n)


def test_transfers_larger_than_the_fifo_stream_between_processes_in_order() -> None:
    sizes = [CAP * 5 + 3, 1, 4093, CAP - 1, 3 * CAP + 777, 600_000]
    fd = BulkArea.create(CAP)
    p = multiprocessing.get_context("fork").Process(target=_echo, args=(fd, sizes))
    p.start()
    area = BulkArea(fd, lambda: True)
    os.close(fd)
    try:
        for i, n in enumerate(sizes):
            data = os.urandom(n)
            got = bytearray(n)
            # the echo writes back while this side still writes: read on a thread
            t = threading.Thread(target=area.get, args=(D2H, got, n))
            t.start()
            area.put(H2D, data, n)
            t.join(30)
            assert bytes(got) == data, f"transfer {i} ({n} bytes) differs"
    finally:
        p.join(30)
    assert p.exitcode == 0


def test_discards_and_zero_fills_keep_the_sides_in_step() -> None:
    guest, worker = _pair()
    guest.put(H2D, b"a" * 1000, 1000)
    guest.put(H2D, b"b" * 3000, 3000)
    worker.get(H2D, None, 1000)  # a failed call's bytes, skipped
    got = bytearray(3000)
    worker.get(H2D, got, 3000)
    assert got == b"b" * 3000
    worker.put(D2H, None, 500)  # a failed read's bytes: zeros
    worker.put(D2H, b"c" * 10, 10)
    out = bytearray(b"\xff" * 510)
    guest.get(D2H, out, 510)
    assert out == bytes(500) + b"c" * 10


def test_closing_ends_waits_but_published_bytes_stay_readable() -> None:
    guest, worker = _pair()
    guest.put(H2D, b"x" * 100, 100)
    errors: list[RingClosed] = []

    def blocked_read() -> None:
        try:
            worker.get(H2D, bytearray(200), 200)  # only 100 bytes will ever come
        except RingClosed as e:
            errors.append(e)

    t = threading.Thread(target=blocked_read)
    t.start()
    time.sleep(0.2)
    guest.close_streams()
    t.join(5)
    assert not t.is_alive() and errors and errors[0].code == "UNAVAILABLE"
    with pytest.raises(RingClosed):
        guest.put(H2D, b"z" * 10, 10)  # a closed area takes nothing
    guest2, worker2 = _pair()
    guest2.put(H2D, b"q" * 64, 64)
    guest2.close_streams()
    got = bytearray(64)
    worker2.get(H2D, got, 64)  # what was published before the close is still there
    assert got == b"q" * 64


def test_a_full_fifo_reports_a_dead_peer() -> None:
    alive = [True]
    guest, _worker = _pair(lambda: alive[0])
    guest.put(H2D, bytes(CAP), CAP)  # nobody reads: the FIFO is full
    alive[0] = False
    t0 = time.monotonic()
    with pytest.raises(RingClosed) as e:
        guest.put(H2D, b"more", 4)
    assert e.value.code == "UNAVAILABLE" and time.monotonic() - t0 < 2


def test_a_corrupt_fifo_is_refused_not_read_out_of_bounds() -> None:
    fd = BulkArea.create(CAP)
    try:
        with mmap.mmap(fd, os.fstat(fd).st_size) as m:
            # the H2D FIFO's head (after the 64-byte control words): far past its tail
            struct.pack_into("<Q", m, 64, 5 * CAP)
        worker = BulkArea(fd, lambda: True)
    finally:
        os.close(fd)
    with pytest.raises(RingClosed) as e:
        worker.get(H2D, bytearray(16), 16)
    assert e.value.code == "DATA_LOSS"


def test_a_mapping_that_is_not_a_bulk_area_is_refused() -> None:
    fd = os.memfd_create("not-bulk")
    try:
        os.ftruncate(fd, 1 << 20)
        with pytest.raises(OSError, match="not a bulk area"):
            BulkArea(fd, lambda: True)
    finally:
        os.close(fd)


def test_a_producer_reads_back_what_the_consumer_has_not_taken_even_after_close() -> None:
    """What a resend of staged calls the worker never ran carries: their bytes, read back
    from the FIFO (across its wrap), after the area closed."""
    guest, worker = _pair()
    guest.put(H2D, bytes(CAP - 100), CAP - 100)
    worker.get(H2D, None, CAP - 100)  # ran: the next bytes wrap around the FIFO's end
    start = guest.head(H2D)
    assert start == CAP - 100
    data = os.urandom(5000)
    guest.put(H2D, data, len(data))
    guest.close_streams()
    assert guest.peek(H2D, start, len(data)) == data
    assert guest.peek(H2D, start + 1000, 10) == data[1000:1010]
