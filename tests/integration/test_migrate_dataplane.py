"""Live migration's data plane between real daemons: memory on parallel sockets straight to the
destination's worker (crane/migrate/dataplane.py), with zeros skipped and compressible chunks
compressed, under the program's own check (a bit-identical result) and the memory's.

Faults the destination must catch (a damaged chunk, a connection dropped mid-frame) abort the
migration with the session still on its source, as a failure of the stream does; a source whose
data connections are refused falls back to the stream and still moves the session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from crane.cli.main import main as crane_main
from crane.cli.migrate import migrate
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.migrate.dataplane import CHUNK, TEST_FAULT_ENV
from tests.integration.net import tcp_address
from tests.integration.procs import where_stuck
from tests.integration.test_migrate import (
    STEPS,
    Guest,
    _finishes_on_source,
    _nothing_left,
    _wait_no_sessions,
)
from tests.integration.workload import reference

MiB = 1 << 20
SIZE = 24 * MiB  # six data-plane chunks


#: Daemons on one host hand the memory over (crane/migrate/handover.py): these tests are
#: about the copy, so their daemons (and workers) use the data plane.
pytestmark = pytest.mark.usefixtures("copy_on_one_host")


def _pair(tmp_path: Path, env: dict[str, str] | None = None) -> tuple[DaemonProcess, ...]:
    a = DaemonProcess(tmp_path / "a", ["sim:h100-80gb"], env=env)
    try:
        b = DaemonProcess(tmp_path / "b", ["sim:h100-80gb"])
    except BaseException:
        a.stop()
        raise
    return a, b


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[DaemonProcess, ...]]:
    a, b = _pair(tmp_path)
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def _contents(kind: str) -> bytes:
    """Noise (zstd cannot shrink it), zeros, or chunks of noise, zeros and a compressible
    pattern in turn (the three decisions in one session)."""
    if kind == "noise":
        return os.urandom(SIZE)
    if kind == "zeros":
        return bytes(SIZE)
    ramp = np.arange(CHUNK, dtype=np.uint32).astype(np.uint8).tobytes()
    parts = [os.urandom(CHUNK), bytes(CHUNK), ramp]
    return b"".join(parts[i % 3] for i in range(SIZE // CHUNK))


def _fill(s: GuestSession, data: bytes) -> int:
    buf = s.mem_alloc(len(data))
    if any(data):
        s.memcpy_htod(buf, data)
    else:  # zeros the program wrote: ordinary memory on the source
        s.memset_d8(buf, 0xAB, len(data))
        s.memset_d8(buf, 0, len(data))
    s.synchronize()
    return buf


@pytest.mark.parametrize("kind", ["noise", "zeros", "mixed"])
def test_memory_and_program_arrive_bit_identical(
    pair: tuple[DaemonProcess, ...], image: bytes, kind: str
) -> None:
    a, b = pair
    want = reference(a.address, image, STEPS)
    data = _contents(kind)
    with GuestSession(a.address, client=f"dp-{kind}") as s:
        buf = _fill(s, data)
        g = Guest(s, image)
        g.wait_steps(5)
        out = list(migrate(a.address, s.session_id, b.address))
        assert out[-1].phase == "done", out[-1]
        assert g.finish() == want  # the program's own result, finished on b
        assert s._t.address == b.address
        assert s.memcpy_dtoh(buf, SIZE) == data
    log = a.log_text()
    assert "data plane to 127.0.0.1:" in log, log[-2000:]
    if kind == "zeros":  # markers, not bytes
        assert out[-1].bytes_sent < SIZE // 8, out[-1]
    if kind == "mixed":  # the noise third travels, the rest is a marker or compressed
        assert SIZE // 3 <= out[-1].bytes_sent < SIZE * 2 // 3, out[-1]
    _wait_no_sessions(a)


def test_tls_between_daemons(daemons: tuple[DaemonProcess, DaemonProcess], image: bytes) -> None:
    """Daemons that talk mutual TLS open the data plane with TLS too."""
    dst, src = daemons
    want = reference(src.address, image, STEPS)
    data = _contents("mixed")
    with GuestSession(tcp_address(src), client="dp-tls") as s:  # a guest of both daemons
        buf = _fill(s, data)
        g = Guest(s, image)
        g.wait_steps(5)
        out = list(migrate(src.address, s.session_id, tcp_address(dst)))
        assert out[-1].phase == "done", out[-1]
        assert g.finish() == want
        assert s.memcpy_dtoh(buf, SIZE) == data
    assert "streams, TLS" in src.log_text()


@pytest.mark.parametrize("fault", ["corrupt", "drop"])
def test_a_bad_data_connection_aborts_with_the_source_running(
    tmp_path: Path, image: bytes, fault: str
) -> None:
    a, b = _pair(tmp_path, {**os.environ, TEST_FAULT_ENV: fault})
    try:
        want = reference(a.address, image, STEPS)
        with GuestSession(a.address, client=f"dp-{fault}") as s:
            data = _contents("noise")
            buf = _fill(s, data)
            g = Guest(s, image)
            g.wait_steps(5)
            out = list(migrate(a.address, s.session_id, b.address))
            assert out[-1].phase == "failed", out[-1]
            why = {"corrupt": "checksum mismatch", "drop": "data connection"}[fault]
            assert why in out[-1].error, out[-1].error
            _finishes_on_source(g, a, want)
            assert s.memcpy_dtoh(buf, SIZE) == data
        _nothing_left(a, b)
    finally:
        a.stop()
        b.stop()


def test_refused_data_plane_falls_back_to_the_stream(tmp_path: Path, image: bytes) -> None:
    a, b = _pair(tmp_path, {**os.environ, TEST_FAULT_ENV: "token"})
    try:
        want = reference(a.address, image, STEPS)
        data = _contents("mixed")
        with GuestSession(a.address, client="dp-fallback") as s:
            buf = _fill(s, data)
            g = Guest(s, image)
            g.wait_steps(5)
            out = list(migrate(a.address, s.session_id, b.address))
            assert out[-1].phase == "done", out[-1]
            assert g.finish() == want
            assert s.memcpy_dtoh(buf, SIZE) == data
        assert "memory goes in the stream" in a.log_text()
        assert "wrong token" in b.log_text()
    finally:
        a.stop()
        b.stop()


def test_stopped_destination_worker_fails_within_the_timeout(
    pair: tuple[DaemonProcess, ...], image: bytes
) -> None:
    """The destination's worker stops reading its data connections mid-round (SIGSTOP): the
    source's senders block, its progress deadline fires and closes them, the migration fails
    naming the step, and the guest carries on at the source."""
    a, b = pair
    timeout_s = 3.0
    data = _contents("noise") * 16  # 384 MiB: far more than the sockets' buffers hold
    stopped: list[int] = []
    try:
        with GuestSession(a.address, client="dp-stopped") as s:
            buf = _fill(s, data)
            # held at step 100 until the migration failed: a guest on the call ring could
            # otherwise run every step first, and "the program runs on" waited out its 30 s
            g = Guest(s, image, pause_at=100)
            g.wait_steps(5)
            argv = ["--daemon", a.address, "migrate", "--session", s.session_id]
            argv += ["--to", b.address, "--timeout", f"{timeout_s:g}"]
            out: list[int] = []
            t = threading.Thread(target=lambda: out.append(crane_main(argv)))
            t.start()
            deadline = time.monotonic() + 30
            while "data plane to" not in a.log_text():
                assert time.monotonic() < deadline and t.is_alive(), "no data plane opened"
                time.sleep(0.005)
            for pid in _children(b):  # the incoming session's worker (and the new spare)
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            t0 = time.monotonic()
            t.join(timeout_s + 30)
            took = time.monotonic() - t0
            assert out == [1], out
            assert took < timeout_s + 10, took
            assert "unresponsive: no progress" in a.log_text()
            assert "on the data plane" in a.log_text()
            at = g.steps
            g.go.set()
            g.wait_steps(at + 3, timeout=30)  # the program runs on
            assert g.steps >= at + 3, where_stuck(g.thread, [a])
            _resume(stopped)
            assert s._t.address == a.address
            assert s.memcpy_dtoh(buf, len(data)) == data
            g.finish([a])
        _wait_no_sessions(a)
    finally:
        _resume(stopped)


def _resume(pids: list[int]) -> None:
    """SIGCONT what is still there (the daemon may have ended a worker it released)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    pids.clear()


def _children(d: DaemonProcess) -> list[int]:
    """The daemon's worker processes."""
    tasks = Path(f"/proc/{d.proc.pid}/task")
    return [int(x) for t in tasks.iterdir() for x in (t / "children").read_text().split()]
