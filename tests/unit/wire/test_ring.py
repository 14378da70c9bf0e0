"""The call ring's core: records wrap around, large messages go in pieces, a parked waiter is
woken by the other process, waits time out, and a dead peer is noticed."""

from __future__ import annotations

import multiprocessing
import os
import socket
import threading
import time

import pytest

from crane.wire import ring as rmod
from crane.wire.ring import REPLIES, REQUESTS, Ring, RingClosed

pytestmark = pytest.mark.skipif(bool(rmod.available()), reason=rmod.available() or "")


def _pair(cap: int, alive=lambda: True) -> tuple[Ring, Ring]:
    fd = Ring.create(cap)
    try:
        return Ring(fd, REQUESTS, alive), Ring(fd, REPLIES, alive)
    finally:
        os.close(fd)


def test_records_wrap_around_in_order() -> None:
    guest, worker = _pair(8192)
    sizes = [1, 7, 8, 100, 1000, 3000, 0, 4088 - 8, 5, 2047] * 40
    for i, n in enumerate(sizes):
        msg = bytes([i % 251]) * n
        guest.send(msg)
        assert worker.recv() == msg  # consumed at once: the writer position keeps wrapping


def test_messages_larger_than_the_ring_go_in_pieces() -> None:
    guest, worker = _pair(8192)
    big = os.urandom(100_000)  # twelve rings' worth: the reader must take pieces as they come
    got: list[bytes] = []
    t = threading.Thread(target=lambda: got.append(worker.recv()))
    t.start()
    guest.send(big)
    t.join(10)
    assert got == [big]


def test_messages_around_the_kept_receive_buffer_arrive_whole() -> None:
    """A message up to SMALL_MESSAGE is waited for and copied by one C call into the buffer
    the ring keeps; a longer one waits and is then taken into a buffer of its own; a message in
    pieces mixes both. Each size on both sides of the border, and a kept buffer reused."""
    guest, worker = _pair(1 << 20)
    small = rmod.SMALL_MESSAGE
    sizes = [small - 1, small, small + 1, 3, 300_000, small, 5, (1 << 20) * 2 + 7]
    got: list[bytes] = []
    t = threading.Thread(target=lambda: got.extend(worker.recv() for _ in sizes))
    t.start()
    sent = [os.urandom(n) for n in sizes]
    for m in sent:
        guest.send(m)
    t.join(10)
    assert [len(g) for g in got] == sizes
    assert got == sent
    assert all(type(g) is bytes for g in got)


def test_a_full_ring_times_out_while_the_peer_lives_then_reports_it_gone() -> None:
    alive = [True]
    guest, _worker = _pair(8192, lambda: alive[0])
    for _ in range(3):
        guest.send(b"x" * 2000)  # nobody reads: the ring fills
    alive[0] = False
    t0 = time.monotonic()
    with pytest.raises(RingClosed) as e:
        guest.send(b"y" * 3000)
    assert e.value.code == "UNAVAILABLE"
    assert time.monotonic() - t0 < 2


def test_an_empty_ring_wait_times_out_without_a_message() -> None:
    _guest, worker = _pair(8192)
    flags = rmod.ffi.new("uint32_t *")
    t0 = time.monotonic()
    n = rmod.lib.crane_ring_wait(worker._base, worker.cap, REQUESTS, 50, 0, flags)
    assert n == -110  # -ETIMEDOUT
    assert 0.04 < time.monotonic() - t0 < 1


def test_end_carries_a_code_and_message() -> None:
    guest, worker = _pair(8192)
    worker.end("UNAVAILABLE", "session s is parked")
    with pytest.raises(RingClosed) as e:
        guest.recv()
    assert (e.value.code, e.value.message) == ("UNAVAILABLE", "session s is parked")


def _echo(fd: int, rounds: int, spin: int) -> None:
    os.environ["CRANE_RING_SPIN"] = str(spin)
    r = Ring(fd, REPLIES, lambda: True)
    for _ in range(rounds):
        r.send(r.recv())


@pytest.mark.parametrize("spin", [0, 50])
def test_two_processes_ping_pong_parked_and_spinning(spin: int, monkeypatch) -> None:
    """spin 0: every wait parks on the futex, so every message needs the doorbell; a lost
    wake-up would hang a round (the waits' timeouts would make it take 100 ms). spin 50: most
    answers are caught while yield-spinning, the rest after parking: both paths mix."""
    monkeypatch.setenv("CRANE_RING_SPIN", str(spin))
    fd = Ring.create(1 << 16)
    rounds = 2000
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=_echo, args=(fd, rounds, spin))
    p.start()
    guest = Ring(fd, REQUESTS, lambda: True)
    os.close(fd)
    t0 = time.monotonic()
    for i in range(rounds):
        msg = i.to_bytes(4, "little") * (1 + i % 50)
        guest.send(msg)
        assert guest.recv() == msg
    took = time.monotonic() - t0
    p.join(10)
    assert p.exitcode == 0
    assert took < rounds * 0.05  # no round waited out a timeout (a lost wake-up: 100 ms)


def test_a_dead_peer_process_is_noticed_by_a_waiting_reader() -> None:
    a, b = socket.socketpair()
    fd = Ring.create(8192)
    guest = Ring(fd, REQUESTS, lambda: rmod.peer_alive(a))
    os.close(fd)
    pid = os.fork()
    if pid == 0:  # the "worker": exits without a word
        os._exit(0)
    b.close()
    os.waitpid(pid, 0)
    t0 = time.monotonic()
    with pytest.raises(RingClosed):
        guest.recv()
    assert time.monotonic() - t0 < 2


def test_a_foreign_memfd_is_refused() -> None:
    fd = os.memfd_create("x")
    os.ftruncate(fd, 1 << 16)
    with pytest.raises(rmod.RingRefused):
        Ring(fd, REQUESTS, lambda: True)
    os.close(fd)


@pytest.mark.parametrize(
    "corrupt",
    ["length", "pad", "tail"],
)
def test_a_corrupt_ring_is_refused_not_read_out_of_bounds(corrupt: str) -> None:
    """The peer shares the memory and may scribble on it: lengths and positions that do not add
    up end the stream (DATA_LOSS) instead of a read past the ring."""
    guest, worker = _pair(8192)
    guest.send(b"hello")
    base = worker._map
    hdr = 4096  # the control page; ring 0's data follows it
    req = 64  # ring 0's header (head at +0, tail at +64)
    if corrupt == "length":
        base[hdr : hdr + 4] = ((1 << 31) - 1).to_bytes(4, "little")
    elif corrupt == "pad":
        base[hdr + 4 : hdr + 8] = (0x80000000).to_bytes(4, "little")  # a pad short of the end
    else:
        base[req + 64 : req + 72] = (8192 - 4).to_bytes(8, "little")  # a tail off alignment
    with pytest.raises(RingClosed) as e:
        worker.recv()
    assert e.value.code == "DATA_LOSS"


def test_a_send_gives_up_at_its_deadline_while_the_peer_lives() -> None:
    guest, _worker = _pair(8192)
    for _ in range(3):
        guest.send(b"x" * 2000)  # nobody reads: the ring fills
    t0 = time.monotonic()
    with pytest.raises(RingClosed) as e:
        due = time.monotonic() + 0.2
        guest.send(b"y" * 3000, deadline=lambda: due)
    assert e.value.code == "DEADLINE_EXCEEDED"
    assert 0.15 < time.monotonic() - t0 < 2


@pytest.mark.parametrize(
    ("setting", "spin"),
    [("", rmod.DEFAULT_SPIN), ("0", 0), ("75", 75), ("-5", 0), ("9" * 12, 1_000_000),
     ("fast", rmod.DEFAULT_SPIN)],
)  # fmt: skip
def test_the_spin_setting_is_microseconds_within_bounds(
    setting: str, spin: int, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("CRANE_RING_SPIN", setting)
    guest, worker = _pair(8192)
    assert guest.spin == spin
    guest.send(b"x")  # a bad setting must not break a call
    assert worker.recv() == b"x"


_CLOSE_UNDER_WAIT = """
import threading, time
from crane.wire.ring import REPLIES, REQUESTS, Ring, RingClosed
fd = Ring.create(1 << 16)
a, b = Ring(fd, REQUESTS, lambda: True), Ring(fd, REPLIES, lambda: True)
outcome = []
def wait():
    try:
        b.recv()
    except RingClosed as e:
        outcome.append(e)
for _ in range(20):
    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.02)  # inside the C wait
    b.close()
    t.join(5)
    assert not t.is_alive(), "the wait did not end after close"
    b = Ring(fd, REPLIES, lambda: True)
assert len(outcome) == 20, outcome
print("ok")
"""


def test_closing_under_a_waiting_thread_ends_the_wait_without_unmapping_it() -> None:
    """A guest's transport closes its ring while its reader thread is inside the C wait (a
    migration's re-attach, a session's close): the mapping must outlive that wait, which then
    ends with RingClosed. Unmapping it under the wait crashed the process (SIGSEGV), so the
    check runs in a child process."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", _CLOSE_UNDER_WAIT], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and "ok" in r.stdout, (r.returncode, r.stderr[-2000:])
