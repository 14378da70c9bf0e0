"""Same-host live migration hands the simulated GPU's memory over instead of copying it
(crane/migrate/handover.py): the source worker passes its memfd to the destination worker,
which maps it over its window in the stopped round.

A guest steps a program whose result must stay bit-identical (pointers kept in device memory,
a module variable) beside a buffer of noise that must arrive unchanged; the migration must
report the memory handed over and (next to) nothing on the wire. An abort after the hand-over
leaves the source running on its memory; a destination that is not on this host gets the data
plane; frees after a hand-over release the memory; later moves (back, then to another host),
checkpoints and the daemons' accounting keep working.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from crane.cli.control_client import ControlClient
from crane.cli.main import main as crane_main
from crane.cli.migrate import migrate
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.migrate.handover import TEST_BOOT_ID_ENV
from crane.v1 import control_pb2
from tests.integration.procs import worker_processes
from tests.integration.test_migrate import STEPS, Guest, _wait_no_sessions
from tests.integration.test_migrate_hold import Held
from tests.integration.workload import reference

MiB = 1 << 20
SIZE = 24 * MiB
ELSEWHERE = {TEST_BOOT_ID_ENV: "00000000-0000-4000-8000-000000000000"}  # "another host"


def _daemon(
    root: Path, name: str, profile: str, env: dict[str, str] | None = None
) -> DaemonProcess:
    return DaemonProcess(
        root / name,
        [f"sim:{profile}"],
        env={**os.environ, **env} if env else None,
        checkpoint_dir=root,
    )


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    a = _daemon(tmp_path, "a", "a100-80gb")  # up a model: nothing the guest was told is lower
    try:
        b = _daemon(tmp_path, "b", "h100-80gb")
    except BaseException:
        a.stop()
        raise
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def _fill(s: GuestSession, data: bytes) -> int:
    buf = s.mem_alloc(len(data))
    s.memcpy_htod(buf, data)
    s.synchronize()
    return buf


def _move(src: DaemonProcess, sid: str, dst: DaemonProcess) -> control_pb2.MigrateProgress:
    out = list(migrate(src.address, sid, dst.address))
    assert out[-1].phase == "done", out[-1]
    return out[-1]


def _handed_over(p: control_pb2.MigrateProgress, at_least: int) -> None:
    """Memory handed over, none of it copied: only the graph and images went on the wire."""
    assert p.handed_over_bytes >= at_least, p
    assert p.memory_bytes == 0 and p.bytes_sent < 2 * MiB, p


def _memfd_bytes(d: DaemonProcess) -> int:
    """Bytes the device memory of ``d``'s session worker holds (its memfd's blocks)."""
    held = []
    for pid in worker_processes(d.proc.pid):
        fds = Path(f"/proc/{pid}/fd")
        for fd in fds.iterdir():
            try:
                if os.readlink(fd).startswith("/memfd:crane-sim-"):
                    held.append(os.stat(fd).st_blocks * 512)
            except OSError:
                continue
    # the worker's own memfd from before the hand-over lingers empty (punched) in its mmap
    # object's duplicate of the descriptor: the one that holds the memory is the adopted one
    assert held, "no session worker"
    return max(held)


def _used(d: DaemonProcess) -> int:
    with ControlClient(d.address) as c:
        return sum(x.used_mem for x in c.devices().devices)


def _moved_while_stepping(
    src: DaemonProcess, dst: DaemonProcess, image: bytes, client: str
) -> control_pb2.MigrateProgress:
    """Move a stepping program with a buffer of noise beside it from ``src`` to ``dst``: the
    program's result and the buffer must come out as if nothing happened."""
    want = reference(src.address, image, STEPS)
    data = os.urandom(SIZE)
    with GuestSession(src.address, client=client) as s:
        buf = _fill(s, data)
        g = Guest(s, image)
        g.wait_steps(5)
        last = _move(src, s.session_id, dst)
        assert g.finish() == want  # the program's own result, finished on dst
        assert s._t.address == dst.address
        assert s.memcpy_dtoh(buf, SIZE) == data
    return last


def test_memory_is_handed_over_not_copied(
    pair: tuple[DaemonProcess, DaemonProcess], image: bytes
) -> None:
    a, b = pair
    _handed_over(_moved_while_stepping(a, b, image, "handover"), SIZE)
    assert "memory handed over to" in a.log_text()
    assert "mapped the memory the source handed over" in b.log_text()
    _wait_no_sessions(a)
    _wait_no_sessions(b)


def test_stop_and_copy_hands_over_in_its_one_round(
    pair: tuple[DaemonProcess, DaemonProcess], capsys: pytest.CaptureFixture[str]
) -> None:
    """``crane migrate --no-precopy``: the one (stopped, fresh) round builds the destination's
    worker and hands the memory over, and the command says so."""
    a, b = pair
    with GuestSession(a.address, client="handover-stop-and-copy") as s:
        data = os.urandom(SIZE)
        buf = _fill(s, data)
        argv = ["--daemon", a.address, "migrate", "--session", s.session_id]
        assert crane_main([*argv, "--to", b.address, "--no-precopy"]) == 0
        out = capsys.readouterr().out
        assert "1 round(s)" in out and "MiB of memory handed over (not copied)" in out, out
        assert s.memcpy_dtoh(buf, SIZE) == data
        assert s._t.address == b.address


def test_an_abort_after_the_hand_over_leaves_the_source_intact(
    pair: tuple[DaemonProcess, DaemonProcess], image: bytes
) -> None:
    """Held after the final round (the destination mapped the memory and acknowledged), then
    aborted: the guest carries on at the source with its memory as it was, the destination
    drops its mapping, and a second move still hands the memory over."""
    a, b = pair
    want = reference(a.address, image, STEPS)
    data = os.urandom(SIZE)
    with GuestSession(a.address, client="handover-abort") as s:
        buf = _fill(s, data)
        g = Guest(s, image, pause_at=STEPS // 2)
        g.wait_steps(5)
        m = Held(a.address, s.session_id, b.address)
        assert m.held.wait(60), m.progress
        assert "mapped the memory the source handed over" in b.log_text()
        assert m.decide("Abort") == "held"
        assert m.last().phase == "failed"
        _wait_no_sessions(b)
        assert s.memcpy_dtoh(buf, SIZE) == data
        s.memset_d8(buf, 0x5A, MiB)  # the source serves (and writes) its memory again
        assert s.memcpy_dtoh(buf, MiB) == b"\x5a" * MiB
        _handed_over(_move(a, s.session_id, b), SIZE)
        assert s.memcpy_dtoh(buf, SIZE) == b"\x5a" * MiB + data[MiB:]
        g.go.set()
        assert g.finish() == want
        assert s._t.address == b.address


def test_not_on_this_host_falls_back_to_the_data_plane(tmp_path: Path, image: bytes) -> None:
    """A destination whose kernel boot id differs is on another host: the memory is copied on
    the data plane (the reason logged), and the program does not notice."""
    a = _daemon(tmp_path, "a", "a100-80gb")
    b = _daemon(tmp_path, "b", "a100-80gb", ELSEWHERE)
    try:
        last = _moved_while_stepping(a, b, image, "handover-elsewhere")
        assert last.handed_over_bytes == 0 and last.memory_bytes >= SIZE, last
        log = a.log_text()
        assert "runs on another host" in log and "data plane to 127.0.0.1:" in log
    finally:
        a.stop()
        b.stop()


def test_frees_after_a_hand_over_release_the_memory(
    pair: tuple[DaemonProcess, DaemonProcess], image: bytes
) -> None:
    """On the destination the memory is its own once the guest is there: a chunk the guest
    unmaps is released (the memfd's blocks drop), and both daemons' accounting agrees."""
    a, b = pair
    with GuestSession(a.address, client="handover-free") as s:
        x = _fill(s, os.urandom(32 * MiB))
        y = _fill(s, os.urandom(32 * MiB))
        used = _used(a)
        assert used >= 64 * MiB
        _handed_over(_move(a, s.session_id, b), 64 * MiB)
        s.synchronize()  # the guest is on b now
        _wait_no_sessions(a)  # the source released everything it charged
        assert _used(b) == used
        before = _memfd_bytes(b)
        assert before >= 64 * MiB
        s.mem_free(x)
        s.mem_free(y)
        s.synchronize()
        assert _memfd_bytes(b) <= before - 32 * MiB  # one chunk unmapped (one kept spare)
        assert _used(b) <= used - 32 * MiB


def test_back_then_to_another_host_then_a_checkpoint(tmp_path: Path, image: bytes) -> None:
    """A -> B -> A hands the same memory on twice, the program running a few steps on each
    (kernels writing the memory it was handed); A -> C (another host) then copies it on the
    data plane, which needs the dirty tracker to have learnt the program's pointer tables
    from memory that never passed through it; a checkpoint on C carries the memory."""
    a = _daemon(tmp_path, "a", "a100-80gb")
    b = _daemon(tmp_path, "b", "a100-80gb")
    c = _daemon(tmp_path, "c", "a100-80gb", ELSEWHERE)
    allowed = threading.Semaphore(0)  # steps the program may take

    def run(g: Guest, n: int) -> None:
        at = g.steps
        for _ in range(n):
            allowed.release()
        g.wait_steps(at + n)
        assert g.steps == at + n

    try:
        want = reference(a.address, image, STEPS)
        data = os.urandom(SIZE)
        with GuestSession(a.address, client="handover-trip") as s:
            buf = _fill(s, data)
            g = Guest(s, image, each_step=allowed.acquire)
            run(g, 10)
            for src, dst in ((a, b), (b, a)):
                _handed_over(_move(src, s.session_id, dst), SIZE)
                run(g, 10)  # it follows the session and steps there
                assert s._t.address == dst.address
            last = _move(a, s.session_id, c)
            assert last.handed_over_bytes == 0 and last.memory_bytes >= SIZE, last
            run(g, 10)
            with ControlClient(c.address) as cc:
                reply = cc.checkpoint(s.session_id, "trip.ckpt", release=False)
            assert reply.memory_bytes >= SIZE
            run(g, STEPS - 1 - g.steps)  # all but the last, which waits for finish()
            allowed.release()
            assert g.finish() == want
            assert s._t.address == c.address
            assert s.memcpy_dtoh(buf, SIZE) == data
        for d in (a, b):
            _wait_no_sessions(d)
    finally:
        for d in (a, b, c):
            d.stop()


def test_forced_data_plane(tmp_path: Path, image: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """``CRANE_MIGRATE_HANDOVER=0`` in the source's environment copies on the data plane."""
    monkeypatch.setenv("CRANE_MIGRATE_HANDOVER", "0")
    a = _daemon(tmp_path, "a", "h100-80gb")
    monkeypatch.delenv("CRANE_MIGRATE_HANDOVER")
    b = _daemon(tmp_path, "b", "h100-80gb")
    try:
        with GuestSession(a.address, client="handover-forced") as s:
            data = os.urandom(SIZE)
            buf = _fill(s, data)
            last = _move(a, s.session_id, b)
            assert last.handed_over_bytes == 0 and last.memory_bytes >= SIZE, last
            assert s.memcpy_dtoh(buf, SIZE) == data
        assert "CRANE_MIGRATE_HANDOVER=0 forces the data plane" in a.log_text()
    finally:
        a.stop()
        b.stop()
