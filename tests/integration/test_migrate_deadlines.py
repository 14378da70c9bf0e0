"""A migration destination that stops answering (SIGSTOP) must not hold the guest (issue 13,
item 3).

The transfer is paused at a byte count by a proxy (so where the destination stops is
deterministic), the destination daemon is stopped with SIGSTOP, the proxy lets the transfer
go on into it. The source must give up on its own once the destination made no progress for
``crane migrate --timeout`` seconds: the CLI fails within that deadline (plus slack) naming the
destination and the step, the program keeps producing correct results on the source and
finishes there bit-identically, and once the destination is woken up (SIGCONT) it holds no
session and no worker for the abandoned move.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from crane.cli.control_client import ControlClient
from crane.cli.main import main as crane_main
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.migrate.daemon_side import TEST_DELAY_FINAL_ACK_ENV
from tests.integration.net import CutProxy, tcp_address
from tests.integration.test_migrate import (
    BIG,
    STEPS,
    Guest,
    _alive,
    _children,
    _fill_random,
    _finishes_on_source,
    _wait_held,
    _wait_log,
    _wait_no_sessions,
)
from tests.integration.workload import reference

TIMEOUT_S = 5.0
#: The CLI's own start-up and answer, the abort's first attempt (1 s), scheduling on a busy
#: two-core machine.
SLACK_S = 6.0


def _only_the_spare_worker(d: DaemonProcess, timeout: float = 20) -> None:
    """The daemon's only worker is its idle one (prespawn 1): nothing of the move is left."""
    deadline = time.monotonic() + timeout
    while len([p for p in _children(d.proc.pid) if _alive(p)]) > 1:
        assert time.monotonic() < deadline, "the destination keeps the incoming worker"
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["precopy", "no-precopy"])
def test_stopped_destination_fails_the_migration_and_the_guest_carries_on(
    in_stream: None,
    daemons: tuple[DaemonProcess, DaemonProcess],
    image: bytes,
    mode: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dst, src = daemons  # A100 -> H100 (the H100 offers every limit the A100 told)
    want = reference(src.address, image, STEPS)
    stopped = False
    try:
        with (
            GuestSession(src.address, client="hung-dst") as s,
            CutProxy(tcp_address(dst), hold_at=BIG * 5 // 8) as proxy,
        ):
            _fill_random(s)
            g = Guest(s, image, pause_at=10)
            g.wait_steps(10)
            argv = ["--daemon", src.address, "migrate", "--session", s.session_id]
            argv += ["--to", proxy.address, "--timeout", f"{TIMEOUT_S:g}"]
            if mode == "no-precopy":
                argv.append("--no-precopy")
            rc: list[int] = []
            t = threading.Thread(target=lambda: rc.append(crane_main(argv)))
            t.start()
            _wait_held(proxy, t, dst)  # inside round 0 (pre-copy) or the only, stopped, round
            os.kill(dst.proc.pid, signal.SIGSTOP)
            stopped = True
            t0 = time.monotonic()
            g.go.set()
            proxy.release()  # the rest of the round goes into a daemon that reads nothing
            t.join(TIMEOUT_S + SLACK_S + 30)
            took = time.monotonic() - t0
            assert rc == [1], "crane migrate still blocks on the stopped destination"
            with capsys.disabled():
                print(f"\n{mode}: migration failed {took:.2f} s after the destination stopped")
            assert took < TIMEOUT_S + SLACK_S
            err = capsys.readouterr().err.strip()
            line = err.splitlines()[-1]
            assert line.startswith(f"crane: migration of session {s.session_id} failed: "), err
            assert f"destination {proxy.address} unresponsive" in line, line
            assert f"no progress for {TIMEOUT_S:g} s" in line, line
            step = "(pre-copy)" if mode == "precopy" else "final round 0 (switchover"
            assert step in line, line
            assert f"session {s.session_id}" in src.log_text()
            assert "unresponsive: no progress" in src.log_text()
            with ControlClient(src.address) as c:
                (info,) = c.sessions().sessions
            assert info.state in ("ready", "running") and not info.location
            at = g.steps
            g.wait_steps(at + 5, timeout=30)  # the program runs on while the destination sleeps
            os.kill(dst.proc.pid, signal.SIGCONT)
            stopped = False
            _finishes_on_source(g, src, want)
        _wait_no_sessions(dst, timeout=20)
        _only_the_spare_worker(dst)
        _wait_no_sessions(src)
    finally:
        if stopped:
            os.kill(dst.proc.pid, signal.SIGCONT)


def test_source_killed_mid_transfer_leaves_nothing_on_the_destination(
    in_stream: None, daemons: tuple[DaemonProcess, DaemonProcess], image: bytes
) -> None:
    """The source's worker dies in the middle of a round (the source vanishes): the
    destination drops the half-built session and its worker."""
    dst, src = daemons
    with (
        GuestSession(src.address, client="vanishing-src") as s,
        CutProxy(tcp_address(dst), hold_at=BIG * 5 // 8) as proxy,
    ):
        _fill_random(s)
        g = Guest(s, image, pause_at=10)
        g.wait_steps(10)
        argv = ["--daemon", src.address, "migrate", "--session", s.session_id]
        rc: list[int] = []
        t = threading.Thread(target=lambda: rc.append(crane_main([*argv, "--to", proxy.address])))
        t.start()
        _wait_held(proxy, t, dst)
        opened = src.log_text().split(f"session {s.session_id} opened")[1]
        worker = int(opened.split("worker pid ")[1].split()[0])
        os.kill(worker, signal.SIGKILL)
        proxy.release()
        t.join(60)
        assert rc == [1]
        g.go.set()
    _wait_no_sessions(dst, timeout=20)
    _only_the_spare_worker(dst)


def test_stopped_destination_fails_the_preflight_within_the_deadline(
    daemons: tuple[DaemonProcess, DaemonProcess], capsys: pytest.CaptureFixture[str]
) -> None:
    """Stopped before the migration starts: its pre-flight gets no answer, nothing moved."""
    dst, src = daemons
    os.kill(dst.proc.pid, signal.SIGSTOP)
    try:
        with GuestSession(src.address, client="hung-preflight") as s:
            p = s.mem_alloc(1 << 20)
            s.memset_d8(p, 3, 1 << 20)
            argv = ["--daemon", src.address, "migrate", "--session", s.session_id]
            argv += ["--to", dst.address, "--timeout", "3"]
            t0 = time.monotonic()
            assert crane_main(argv) == 1
            took = time.monotonic() - t0
            assert took < 3 + SLACK_S, took
            line = capsys.readouterr().err.strip().splitlines()[-1]
            assert f"destination {dst.address} unresponsive" in line, line
            assert "no answer to the pre-flight within 3 s" in line, line
            with ControlClient(src.address) as c:
                (info,) = c.sessions().sessions
            assert info.state in ("ready", "running") and not info.location
            assert s.memcpy_dtoh(p + 4096, 2) == b"\x03\x03"
    finally:
        os.kill(dst.proc.pid, signal.SIGCONT)
    _wait_no_sessions(dst)
    _only_the_spare_worker(dst)


def test_destination_hung_at_the_switchover_keeps_nothing(
    tmp_path: Path, image: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The destination commits the final round and then does not acknowledge it (held by the
    test-only delay for far longer than the deadline): the stopped guest resumes on the source
    within the deadline, and the source's abort makes the destination drop the session it had
    committed, long before its acknowledgement would have gone out."""
    src = DaemonProcess(tmp_path / "s", ["sim:h100-80gb"])
    monkeypatch.setenv(TEST_DELAY_FINAL_ACK_ENV, "60")
    dst = DaemonProcess(tmp_path / "d", ["sim:h100-80gb"])
    monkeypatch.delenv(TEST_DELAY_FINAL_ACK_ENV)
    try:
        want = reference(src.address, image, STEPS)
        with GuestSession(src.address, client="hung-switchover") as s:
            g = Guest(s, image)
            g.wait_steps(5)
            argv = ["--daemon", src.address, "migrate", "--session", s.session_id]
            argv += ["--to", dst.address, "--timeout", "3"]
            t0 = time.monotonic()
            assert crane_main(argv) == 1
            took = time.monotonic() - t0
            assert "delaying the final acknowledgement" in dst.log_text()
            assert took < 3 + SLACK_S + 5, took  # pre-copy of a small session included
            line = capsys_line(src)
            assert "waiting for the acknowledgement of the final round" in line, line
            _finishes_on_source(g, src, want)
        _wait_log(dst, "its migration was aborted by the source")
        _wait_no_sessions(dst)
        _only_the_spare_worker(dst)
    finally:
        src.stop()
        dst.stop()


def capsys_line(src: DaemonProcess) -> str:
    """The source daemon's line saying why the migration failed."""
    return next(ln for ln in reversed(src.log_text().splitlines()) if "failed: destination" in ln)
