"""Sessions: isolation, worker per session, cleanup on disconnect, concurrent use."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np

from crane.api.generated.cuda_enums import CUresult
from crane.api.ops import OPS_BY_NAME as O
from crane.cli.control_client import ControlClient
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.wire.channel import open_channel
from tests.integration.polling import wait_for


def test_two_sessions_are_isolated(daemon: DaemonProcess) -> None:
    with GuestSession(daemon.address) as a, GuestSession(daemon.address) as b:
        assert a.session_id != b.session_id
        assert a.va_window[0] != b.va_window[0]
        assert a.device.uuid != b.device.uuid  # each session has its own virtual identity
        pa = a.mem_alloc(4096)
        a.memcpy_htod(pa, b"secret" * 10)
        # b reaches for a's address through the raw protocol: refused, a's data untouched
        op = O["MEMCPY_DTOH"]
        seq = b._t.enqueue(op, op.pack(pa, 60, 0), expect=True)
        reply = b._t.wait(seq)
        assert reply.result == CUresult.CUDA_ERROR_INVALID_VALUE and reply.data == b""
        op = O["MEMCPY_HTOD"]
        seq = b._t.enqueue(op, op.pack(pa, 0), b"x" * 6, expect=True)
        b._t.wait(seq)
        assert a.memcpy_dtoh(pa, 60) == b"secret" * 10
        # each session runs in its own worker process
        with ControlClient(daemon.address) as ctl:
            infos = {s.id: s for s in ctl.sessions().sessions}
        assert set(infos) == {a.session_id, b.session_id}


def test_concurrent_sessions_do_not_interfere(daemon: DaemonProcess) -> None:
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            with GuestSession(daemon.address) as s:
                rng = np.random.default_rng(seed)
                for _ in range(20):
                    data = rng.integers(0, 256, 100_000, dtype=np.uint8)
                    p = s.mem_alloc(data.nbytes)
                    s.memcpy_htod(p, data)
                    assert s.memcpy_dtoh(p, data.nbytes) == data.tobytes()
                    s.mem_free(p)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def test_killed_guest_is_reaped_and_its_memory_freed(daemon: DaemonProcess) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from crane.guest.session import GuestSession
        s = GuestSession({daemon.address!r}, client="doomed")
        s.mem_alloc(1 << 30)
        s.synchronize()
        print("ready", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        with ControlClient(daemon.address) as ctl:
            [info] = ctl.sessions().sessions
            assert info.client == "doomed" and info.mem_used >= 1 << 30
            assert ctl.devices().devices[0].used_mem >= 1 << 30
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            assert wait_for(lambda: not ctl.sessions().sessions)
            assert ctl.devices().devices[0].used_mem == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "session" in daemon.log_text() and "closed" in daemon.log_text()


def test_closed_session_frees_everything(daemon: DaemonProcess) -> None:
    with ControlClient(daemon.address) as ctl:
        s = GuestSession(daemon.address)
        s.mem_alloc(100 << 20)
        s.synchronize()
        assert ctl.devices().devices[0].used_mem >= 100 << 20
        s.close()
        assert wait_for(lambda: not ctl.sessions().sessions)
        assert ctl.devices().devices[0].used_mem == 0


def test_ps_reports_calls_and_memory(daemon: DaemonProcess) -> None:
    with GuestSession(daemon.address, client="counter") as s, ControlClient(daemon.address) as ctl:
        p = s.mem_alloc(1 << 20)
        for _ in range(100):
            s.memset_d8(p, 1, 1 << 20)
        s.synchronize()
        [info] = ctl.sessions().sessions
        assert info.state == "running" and info.calls >= 100 and info.mem_used >= 1 << 20
        assert info.client == "counter" and info.peer


def test_direct_and_relay_paths_are_exclusive(daemon: DaemonProcess, transport: str) -> None:
    import grpc

    from crane.v1 import guest_pb2

    with GuestSession(daemon.address, direct=True) as s, ControlClient(daemon.address) as ctl:
        s.synchronize()
        [info] = ctl.sessions().sessions
        assert info.state == "running" and info.peer.startswith(transport)
        # a second stream through the daemon for the same session is refused
        ch = open_channel(daemon.address)
        calls = ch.stream_stream(
            "/crane.v1.Guest/Calls",
            request_serializer=None,
            response_deserializer=guest_pb2.ReplyBatch.FromString,
        )
        md = (("crane-session", s.session_id), ("crane-token-bin", s._t.opened.resume_token))
        try:
            next(calls(iter([b""]), metadata=md))
            raise AssertionError("second stream accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
        ch.close()
        s.synchronize()  # the attached stream is unaffected


def test_relay_is_used_when_the_worker_socket_is_unreachable(
    daemon: DaemonProcess, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("CRANE_DIRECT", "0")
    with GuestSession(daemon.address) as s:
        assert s._t.path == "relay"
        p = s.mem_alloc(8)
        s.memcpy_htod(p, b"relayed!")
        assert s.memcpy_dtoh(p, 8) == b"relayed!"


def test_crashed_worker_is_reaped_and_the_daemon_carries_on(daemon: DaemonProcess) -> None:
    """A call on a session whose worker was killed fails with CUDA_ERROR_NO_DEVICE and the
    daemon's reason on both the direct and the relay path, whatever noticed the death first."""
    from crane.api.results import CudaError, CUresult

    with ControlClient(daemon.address) as ctl:
        for direct in (True, False):
            s = GuestSession(daemon.address, direct=direct)
            s.mem_alloc(64 << 20)
            s.synchronize()
            worker_pid = int(
                daemon.log_text()
                .split(f"session {s.session_id} opened")[1]
                .split("worker pid ")[1]
                .split()[0]
            )
            os.kill(worker_pid, signal.SIGKILL)
            try:
                s.synchronize()
                raise AssertionError("a call on a dead worker succeeded")
            except CudaError as e:
                # one code and message whichever path noticed first (docs/design.md, Errors)
                path = "direct" if direct else "relay"
                assert e.code == CUresult.CUDA_ERROR_NO_DEVICE, (path, e.code, e.message)
                assert e.message == f"session {s.session_id} ended: its worker process exited", (
                    path,
                    e.message,
                )
            assert wait_for(lambda: not ctl.sessions().sessions)
            assert ctl.devices().devices[0].used_mem == 0
            s._t.close()
        with GuestSession(daemon.address) as fresh:  # the daemon still serves
            fresh.synchronize()
    assert "worker exited with status" in daemon.log_text()


def test_a_restarted_daemon_clears_what_a_crashed_one_left(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """After SIGKILL nothing released the sessions' files; the next daemon on the run
    directory removes them at start-up (no session of the dead daemon lives in it)."""
    run = tmp_path / "run"
    first = DaemonProcess(run, ["sim:h100-80gb"])
    s = GuestSession(first.address, client="crashed")
    try:
        s.mem_alloc(1 << 20)
        stale = run / "sessions" / f"{s.session_id}.stats"
        assert stale.exists()
        first.stop(signal.SIGKILL)
    finally:
        s._t.close()
    with DaemonProcess(run, ["sim:h100-80gb"]) as second:
        assert not stale.exists()
        assert "stale session file" in second.log_text()
        with GuestSession(second.address) as fresh:
            assert (run / "sessions" / f"{fresh.session_id}.stats").exists()
