"""The shared-memory call ring end to end: the same session behaviour as the worker's gRPC
socket (ps, exclusivity, a dead worker's error, parking, live migration), and the fallbacks
(turned off in the guest or the daemon, refused handshakes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from crane.api.ops import OPS_BY_NAME as O
from crane.api.results import CudaError, CUresult
from crane.cli.control_client import ControlClient
from crane.cli.main import main as crane_main
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.wire import ring as wring
from tests.integration.polling import wait_for
from tests.integration.workload import Workload, reference

pytestmark = pytest.mark.skipif(bool(wring.available()), reason=wring.available() or "")


def _worker_pid(daemon: DaemonProcess, sid: str) -> int:
    return int(
        daemon.log_text().split(f"session {sid} opened")[1].split("worker pid ")[1].split()[0]
    )


def test_ps_names_each_sessions_transport(daemon: DaemonProcess, transport: str, capsys) -> None:  # type: ignore[no-untyped-def]
    with GuestSession(daemon.address, client="t", direct=True) as s:
        p = s.mem_alloc(1 << 20)
        s.memset_d8(p, 7, 1 << 20)
        s.synchronize()
        assert s._t.path == transport
        with ControlClient(daemon.address) as ctl:
            [info] = ctl.sessions().sessions
        assert info.transport == transport and info.state == "running"
        assert info.peer.startswith(transport)
        assert info.calls >= 2 and info.mem_used >= 1 << 20
        assert crane_main(["--daemon", daemon.address, "ps", "--json"]) == 0
        [row] = json.loads(capsys.readouterr().out)["sessions"]
        assert row["transport"] == transport
        assert crane_main(["--daemon", daemon.address, "ps"]) == 0
        table = capsys.readouterr().out
        assert "TRANSPORT" in table.splitlines()[0] and f" {transport} " in table


def test_relay_sessions_say_relay(daemon: DaemonProcess, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    with GuestSession(daemon.address, direct=False) as s, ControlClient(daemon.address) as ctl:
        s.synchronize()
        assert s._t.path == "relay"
        assert ctl.sessions().sessions[0].transport == "relay"


def test_calls_answers_and_async_errors_arrive_in_order(
    daemon: DaemonProcess, transport: str
) -> None:
    """Large copies (many ring records each), many small calls between synchronizations, and a
    failed asynchronous call reported at the next synchronizing call, as on the gRPC path."""
    with GuestSession(daemon.address, direct=True) as s:
        n = 24 << 20  # larger than a ring: the copy travels in pieces
        p = s.mem_alloc(n)
        data = os.urandom(n)
        s.memcpy_htod(p, data)
        assert s.memcpy_dtoh(p, n) == data
        for i in range(5000):
            s.memset_d8(p + i, i & 0xFF, 1)
        assert s.memcpy_dtoh(p, 5000) == bytes(i & 0xFF for i in range(5000))
        op = O["MEMCPY_HTOD"]  # past the allocation's end: fails on the worker, asynchronously
        s._t.enqueue(op, op.pack(p + n - 4, 0), b"12345678", expect=False)
        with pytest.raises(CudaError) as e:
            s.synchronize()
        assert e.value.code == CUresult.CUDA_ERROR_INVALID_VALUE
        s.synchronize()  # reported once
        assert s._t.path == transport


def test_a_second_attachment_is_refused_and_a_wrong_token_too(daemon: DaemonProcess) -> None:
    with GuestSession(daemon.address, direct=True) as s:
        s.synchronize()
        assert s._t.path == "ring"
        direct = s._t.opened.direct_address
        with pytest.raises(wring.RingRefused, match="FAILED_PRECONDITION"):
            wring.connect(
                wring.ring_socket_path(direct[len("unix://") :]),
                s.session_id,
                s._t.opened.resume_token,
            )
    with GuestSession(daemon.address, direct=True) as s2:
        path = wring.ring_socket_path(s2._t.opened.direct_address[len("unix://") :])
        # the session is attached already; a wrong token is refused before that is looked at
        with pytest.raises(wring.RingRefused, match="PERMISSION_DENIED"):
            wring.connect(path, s2.session_id, b"\0" * len(s2._t.opened.resume_token))
        s2.synchronize()


def test_turned_off_in_the_daemon_falls_back_to_the_grpc_socket(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "craned.toml"
    cfg.write_text("call_ring = false\n")
    monkeypatch.setenv("CRANE_RING", "1")
    with DaemonProcess(tmp_path / "run", ["sim:h100-80gb"], extra_args=["--config", str(cfg)]) as d:
        with GuestSession(d.address, direct=True) as s, ControlClient(d.address) as ctl:
            s.synchronize()
            assert s._t.path == "direct"
            assert ctl.sessions().sessions[0].transport == "direct"
            assert not Path(wring.ring_socket_path(s._t.opened.direct_address[7:])).exists()
        monkeypatch.setenv("CRANE_RING", "require")
        with pytest.raises(CudaError, match="CRANE_RING=require: no call ring"):
            GuestSession(d.address, direct=True)


def test_turned_off_in_the_guest_uses_the_grpc_socket(
    daemon: DaemonProcess, monkeypatch, caplog
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("CRANE_RING", "0")
    with (
        caplog.at_level("INFO", logger="crane.guest"),
        GuestSession(daemon.address, direct=True) as s,
    ):
        s.synchronize()
        assert s._t.path == "direct"
    assert "call ring not used: CRANE_RING=0" in caplog.text


def test_a_dead_worker_gives_the_same_error_on_both_transports(
    daemon: DaemonProcess, transport: str
) -> None:
    with ControlClient(daemon.address) as ctl:
        s = GuestSession(daemon.address, direct=True)
        p = s.mem_alloc(1 << 20)
        s.synchronize()
        os.kill(_worker_pid(daemon, s.session_id), signal.SIGKILL)
        with pytest.raises(CudaError) as e:
            s.synchronize()
        assert e.value.code == CUresult.CUDA_ERROR_NO_DEVICE, e.value.message
        assert e.value.message == f"session {s.session_id} ended: its worker process exited"
        with pytest.raises(CudaError) as e:  # and at once every call after it, packed ones too
            s.memset_d8(p, 1, 1)
        assert e.value.code == CUresult.CUDA_ERROR_NO_DEVICE, e.value.message
        assert wait_for(lambda: not ctl.sessions().sessions)
        s._t.close()


def test_a_killed_guest_ends_its_session(daemon: DaemonProcess, transport: str) -> None:
    code = (
        "import time; from crane.guest.session import GuestSession\n"
        f"s = GuestSession({daemon.address!r}, direct=True)\n"
        "s.mem_alloc(1 << 20); s.synchronize()\n"
        "print(s._t.path, flush=True); time.sleep(60)\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == transport
        with ControlClient(daemon.address) as ctl:
            assert len(ctl.sessions().sessions) == 1
            p.kill()
            assert wait_for(lambda: not ctl.sessions().sessions)
            assert ctl.devices().devices[0].used_mem == 0
    finally:
        p.kill()
        p.wait()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    a = DaemonProcess(tmp_path / "a", ["sim:a100-40gb"])
    b = DaemonProcess(tmp_path / "b", ["sim:h100-80gb"])
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


STEPS = 120


def test_live_migration_reattaches_on_the_destination(
    pair: tuple[DaemonProcess, DaemonProcess], image: bytes, transport: str
) -> None:
    """The guest keeps stepping on a thread while its session moves; it re-attaches to the new
    worker with the same transport and the result is bit-identical to a run that never moved."""
    a, b = pair
    want = reference(a.address, image, STEPS)
    with GuestSession(a.address, client="moving", direct=True) as s:
        assert s._t.path == transport
        w = Workload(s, image)
        done, errors, steps = threading.Event(), [], [0]

        def run() -> None:
            try:
                for _ in range(STEPS):
                    w.run(1)
                    steps[0] += 1
            except Exception as e:  # reported below
                errors.append(e)
            done.set()

        t = threading.Thread(target=run)
        t.start()
        assert wait_for(lambda: steps[0] >= 5 or done.is_set(), 60)
        assert (
            crane_main(
                ["--daemon", a.address, "migrate", "--session", s.session_id, "--to", b.address]
            )
            == 0
        )
        t.join(120)
        assert not errors, errors
        got = w.result()
        assert s._t.address == b.address and s._t.resumes == 1
        assert s._t.path == transport  # re-attached the same way on the destination
        with ControlClient(b.address) as ctl:
            [info] = [x for x in ctl.sessions().sessions if x.state != "migrated"]
            assert info.transport == transport
    assert got == want


def test_park_and_restore_while_the_guest_keeps_calling(
    daemon: DaemonProcess, transport: str, tmp_path: Path
) -> None:
    """Checkpoint with release quiesces the ring at a call boundary; the guest waits, then
    re-attaches to the restored session's new worker and carries on where it was."""
    ckpt = tmp_path / "busy.ckpt"
    with GuestSession(daemon.address, client="busy", direct=True) as s:
        p = s.mem_alloc(1 << 16)
        s.memset_d8(p, 0, 1 << 16)
        s.synchronize()
        stop, count, errors = threading.Event(), [0], []

        def guest() -> None:
            try:
                while not stop.is_set():
                    s.memset_d8(p, count[0] & 0xFF, 1)
                    s.synchronize()
                    count[0] += 1
            except Exception as e:  # reported below
                errors.append(e)

        t = threading.Thread(target=guest)
        t.start()
        time.sleep(0.2)
        with ControlClient(daemon.address, timeout=None) as c:
            assert c.checkpoint(s.session_id, str(ckpt), release=True).state == "parked"
            c.restore(str(ckpt))
        before = count[0]
        assert wait_for(lambda: count[0] > before + 10 or bool(errors), 30)
        stop.set()
        t.join(60)
        assert not errors, errors
        assert s.memcpy_dtoh(p, 1)[0] == (count[0] - 1) & 0xFF
        assert s._t.resumes == 1 and s._t.path == transport


def test_closing_behind_a_stuck_kernel_and_a_full_ring_does_not_hang(daemon: DaemonProcess) -> None:
    """The worker is inside a kernel that never returns and the request ring is full of copies
    queued behind it: closing the session gives up on the last batch after CLOSE_FLUSH_S
    instead of waiting for room forever (the gRPC path queues and returns; so must the ring),
    and the guest's end then stops the stuck worker."""
    from tests.integration.stuck import SPIN_PTX

    s = GuestSession(daemon.address, client="stuck", direct=True)
    assert s._t.path == "ring"
    flag = s.mem_alloc(4)
    s.memset_d32(flag, 0, 1)
    fn = s.module_get_function(s.module_load(SPIN_PTX.encode() + b"\0"), "spin")
    buf = s.mem_alloc(4 << 20)
    s.synchronize()
    s.launch(fn, grid=(1,), block=(32,), params=[flag])
    s._t.flush()
    op = O["MEMCPY_HTOD"]
    chunk = bytes(4 << 20)
    done = threading.Event()

    def fill() -> None:  # blocks once the ring is full (the worker reads nothing)
        for _ in range(8):
            s._t.enqueue(op, op.pack(buf, 0), chunk, expect=False)
        done.set()

    threading.Thread(target=fill, daemon=True).start()
    time.sleep(1.5)
    assert not done.is_set()  # 32 MiB of copies do not fit in the 16 MiB ring: it is full
    t0 = time.monotonic()
    s._t.close()
    assert time.monotonic() - t0 < 10
    with ControlClient(daemon.address) as ctl:
        assert wait_for(lambda: not ctl.sessions().sessions, 30)
