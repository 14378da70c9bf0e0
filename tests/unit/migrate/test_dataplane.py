"""The migration data plane's pure parts and its sockets, without daemons: chunk encoding
(zeros, compression by sampling, raw), checksum and header checks, the token, round ordering,
and a dropped connection."""

from __future__ import annotations

import os
import socket
import threading
import time

import numpy as np
import pytest

from crane.migrate.dataplane import (
    CHUNK,
    HEADER,
    RAW,
    ZERO,
    ZSTD,
    DataPlaneError,
    Incoming,
    Receiver,
    Sender,
    Timing,
    decode_header,
    encode_chunk,
    is_zero,
    new_token,
    unpack,
)
from crane.migrate.source import data_host


def _frame(round_: int, addr: int, data: bytes, level: int | None = 1) -> tuple[bytes, bytes]:
    head, payload = encode_chunk(round_, addr, data, level)
    return head, bytes(payload)


def test_zero_chunk_is_a_header_alone() -> None:
    head, payload = _frame(3, 0x1000, bytes(CHUNK))
    assert len(head) == HEADER and payload == b""
    f = decode_header(head)
    assert (f.round, f.addr, f.raw_len, f.codec) == (3, 0x1000, CHUNK, ZERO)
    assert unpack(f, b"") is None


def test_is_zero_sees_one_byte() -> None:
    data = bytearray(CHUNK)
    assert is_zero(data)
    data[CHUNK - 1] = 1
    assert not is_zero(data)
    assert not is_zero(memoryview(bytearray(2 * CHUNK))[:-1].tobytes() + b"\x02")


def test_noise_goes_raw_and_patterns_compressed() -> None:
    noise = os.urandom(CHUNK)
    head, payload = _frame(0, 0, noise)
    f = decode_header(head)
    assert f.codec == RAW and payload == noise
    ramp = np.arange(CHUNK // 4, dtype=np.uint32).tobytes()
    head, payload = _frame(0, 0, ramp)
    f = decode_header(head)
    assert f.codec == ZSTD and len(payload) <= CHUNK - CHUNK // 8
    assert bytes(unpack(f, payload) or b"") == ramp
    head, payload = _frame(0, 0, ramp, level=None)  # the caller said: do not even sample
    assert decode_header(head).codec == RAW


def test_raw_payload_is_the_callers_buffer() -> None:
    data = bytearray(os.urandom(1 << 20))
    _, payload = encode_chunk(0, 0, memoryview(data), 1)
    assert isinstance(payload, memoryview) and payload.obj is data  # no copy


def test_checksum_mismatch_is_detected() -> None:
    data = os.urandom(1 << 20)
    head, payload = _frame(1, 0x2000, data)
    damaged = bytearray(payload)
    damaged[12345] ^= 0x40
    with pytest.raises(DataPlaneError, match="checksum mismatch"):
        unpack(decode_header(head), damaged)
    ramp = np.arange(CHUNK // 4, dtype=np.uint32).tobytes()
    head, payload = _frame(1, 0, ramp)
    damaged = bytearray(payload)
    damaged[len(damaged) // 2] ^= 0xFF
    with pytest.raises(DataPlaneError):
        unpack(decode_header(head), damaged)


def test_damaged_header_is_named() -> None:
    head, _ = _frame(1, 0x2000, os.urandom(4096))
    bad = bytearray(head)
    bad[9] ^= 1  # the address
    with pytest.raises(DataPlaneError, match="header's checksum"):
        decode_header(bad)
    with pytest.raises(DataPlaneError, match="magic"):
        decode_header(bytes(HEADER))


def test_timing_line_names_the_steps_that_took_time() -> None:
    """The per-round log line: steps under 1 ms are left out, and a round that was all under
    1 ms says so (it printed "threads:  ms")."""
    assert Timing(read=0.0123, send=0.0004, apply=0.002).ms() == "read 12, apply 2 ms"
    assert Timing(send=0.0004).ms() == "each under 1 ms"


def test_data_host() -> None:
    assert data_host("tcp://10.0.0.5:7000") == "10.0.0.5"
    assert data_host("tcp://[::1]:7000") == "::1"
    assert data_host("unix:///run/crane/crane.sock") == "127.0.0.1"


class Memory:
    """A device stand-in for the receiver: a dict of written chunks."""

    def __init__(self) -> None:
        self.chunks: dict[int, bytes | None] = {}
        self.lock = threading.Lock()

    def apply(self, addr: int, data: bytes | memoryview | None, n: int) -> None:
        with self.lock:
            self.chunks[addr] = None if data is None else bytes(data)


def _reader(chunks: dict[int, bytes]):  # type: ignore[no-untyped-def]
    return lambda addr, n, _round: chunks[addr][:n]


class Device(Memory):
    """A stand-in that takes raw chunks straight from the socket (``Receiver(into=...)``), as
    the simulator's mapping does: into its own buffer, checksummed there."""

    def __init__(self) -> None:
        super().__init__()
        self.direct = 0

    def into(self, addr: int, src: Incoming) -> None:
        buf = bytearray(len(src))
        src.read_into(buf)  # raises on a checksum mismatch: nothing is recorded
        with self.lock:
            self.chunks[addr] = bytes(buf)
            self.direct += 1


def test_parallel_streams_move_noise_zeros_and_patterns() -> None:
    mem = Memory()
    token = new_token()
    rx = Receiver(mem.apply, token)
    src = {
        0: os.urandom(CHUNK),
        CHUNK: bytes(CHUNK),
        2 * CHUNK: np.arange(CHUNK // 8, dtype=np.uint64).tobytes(),
        3 * CHUNK: os.urandom(CHUNK // 3),
    }
    tx = Sender("127.0.0.1", rx.port, token, streams=3)
    try:
        rx.open_round(0)
        for addr, data in src.items():
            tx.send(0, addr, len(data), 1, _reader(src))
        n = tx.flush()
        assert n == 4
        rx.wait(0, n, deadline_s=30)
        assert mem.chunks[CHUNK] is None  # zeros: a marker
        assert {a: d for a, d in mem.chunks.items() if d is not None} == {
            a: d for a, d in src.items() if a != CHUNK
        }
        assert tx.stats.zero == CHUNK and tx.stats.packed == CHUNK
        assert tx.stats.wire < tx.stats.raw - CHUNK  # zeros and the pattern did not travel
    finally:
        tx.close()
        rx.close()


def test_a_round_waits_for_its_graph() -> None:
    """Chunks of round 1 are not applied while the receiver is still in round 0."""
    mem = Memory()
    token = new_token()
    rx = Receiver(mem.apply, token)
    tx = Sender("127.0.0.1", rx.port, token, streams=1)
    try:
        rx.open_round(0)
        src = {0: os.urandom(4096)}
        tx.send(1, 0, 4096, None, _reader(src))
        tx.flush()
        time.sleep(0.3)
        assert mem.chunks == {}
        rx.open_round(1)
        rx.wait(1, 1, deadline_s=30)
        assert mem.chunks[0] == src[0]
    finally:
        tx.close()
        rx.close()


def test_wrong_token_is_refused() -> None:
    rx = Receiver(Memory().apply, new_token())
    try:
        with pytest.raises((DataPlaneError, OSError)):
            Sender("127.0.0.1", rx.port, new_token(), streams=1)
    finally:
        rx.close()


def _raw_conn(port: int, token: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(token)
    assert s.recv(1) == b"\x01"
    return s


@pytest.mark.parametrize("in_place", [False, True])
def test_corrupted_chunk_fails_the_round(in_place: bool) -> None:
    """Received into a buffer, or straight into device memory and checksummed there."""
    dev = Device()
    token = new_token()
    rx = Receiver(dev.apply, token, into=dev.into if in_place else None)
    try:
        rx.open_round(0)
        s = _raw_conn(rx.port, token)
        head, payload = _frame(0, 0, os.urandom(65536))
        assert decode_header(head).codec == RAW
        damaged = bytearray(payload)
        damaged[65535 if in_place else 100] ^= 0x80
        s.sendall(head + bytes(damaged))
        with pytest.raises(DataPlaneError, match="checksum mismatch"):
            rx.wait(0, 1, deadline_s=30)
        assert dev.chunks == {}
        s.close()
    finally:
        rx.close()


def test_connection_dropped_mid_frame_fails_the_round() -> None:
    token = new_token()
    rx = Receiver(Memory().apply, token)
    try:
        rx.open_round(0)
        s = _raw_conn(rx.port, token)
        head, payload = _frame(0, 0, os.urandom(65536))
        s.sendall(head + bytes(payload)[:1000])
        s.close()
        with pytest.raises(DataPlaneError, match="closed a data connection mid-frame"):
            rx.wait(0, 1, deadline_s=30)
    finally:
        rx.close()


def test_sender_reports_a_receiver_that_went_away() -> None:
    token = new_token()
    rx = Receiver(Memory().apply, token)
    tx = Sender("127.0.0.1", rx.port, token, streams=2)
    try:
        rx.close()
        time.sleep(0.1)
        src = {i * CHUNK: os.urandom(CHUNK) for i in range(16)}
        with pytest.raises(DataPlaneError):
            for addr in src:
                tx.send(0, addr, CHUNK, None, _reader(src))
            tx.flush()
    finally:
        tx.close()


def test_a_read_error_is_raised_as_itself() -> None:
    """A failure of the read (the batch boundary's time-out) is not a socket failure."""
    token = new_token()
    rx = Receiver(Memory().apply, token)
    tx = Sender("127.0.0.1", rx.port, token, streams=1)

    class Late(Exception):
        pass

    def read(addr: int, n: int, _round: int) -> bytes:
        raise Late("boundary")

    try:
        tx.send(0, 0, 4096, None, read)
        with pytest.raises(Late):
            tx.flush()
    finally:
        tx.close()
        rx.close()


def test_raw_chunks_land_straight_in_device_memory() -> None:
    dev = Device()
    token = new_token()
    rx = Receiver(dev.apply, token, into=dev.into)
    src = {
        0: os.urandom(CHUNK),
        CHUNK: bytes(CHUNK),
        2 * CHUNK: np.arange(CHUNK // 8, dtype=np.uint64).tobytes(),
        3 * CHUNK: os.urandom(12345),
    }
    tx = Sender("127.0.0.1", rx.port, token, streams=2)
    try:
        for addr, data in src.items():  # sent before the round opens: they wait for it
            tx.send(0, addr, len(data), 1, _reader(src))
        time.sleep(0.3)
        assert dev.chunks == {}
        rx.open_round(0)
        n = tx.flush()
        rx.wait(0, n, deadline_s=30)
        assert dev.direct == 2  # the raw ones; zeros and the pattern went through apply
        assert dev.chunks[CHUNK] is None
        assert {a: d for a, d in dev.chunks.items() if d is not None} == {
            a: d for a, d in src.items() if a != CHUNK
        }
    finally:
        tx.close()
        rx.close()
