"""A daemon operators can trust: no worker outlives its guest or its daemon, and control calls
on a session stuck in a kernel answer within their deadline (issue 13, item 2).

Each test holds a guest inside a kernel that never returns (:mod:`tests.integration.stuck`) on
the simulated GPU, so the worker is busy and reads nothing: whatever ends it must come from
outside it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crane.cli.control_client import ControlClient
from crane.craned.launcher import DaemonProcess
from crane.host.lifeline import alive, process_start
from tests.integration.stuck import start_stuck_guest
from tests.integration.test_sessions import wait_for


def _gone_within(pids: list[int], timeout: float) -> float:
    """Seconds until every pid is gone (or a zombie); fails past ``timeout``."""
    t0 = time.monotonic()
    while any(alive(p) for p in pids):
        assert time.monotonic() - t0 < timeout, [p for p in pids if alive(p)]
        time.sleep(0.05)
    return time.monotonic() - t0


def _worker_pids(run_dir: Path) -> list[int]:
    return [int(p.name) for p in (run_dir / "workers").iterdir() if p.name.isdigit()]


def test_sigkilled_daemon_takes_its_workers_with_it(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "run")
    guest = None
    try:
        guest, _, worker = start_stuck_guest(d, "ring")
        time.sleep(0.5)  # inside the kernel now
        pids = _worker_pids(d.run_dir)
        assert worker in pids and len(pids) >= 2  # the busy worker and an idle one
        assert all(alive(p) for p in pids)
        os.kill(d.proc.pid, signal.SIGKILL)
        d.proc.wait()
        took = _gone_within(pids, 5.0)
        print(f"workers gone {took:.2f} s after craned's SIGKILL")
    finally:
        if guest is not None:
            guest.kill()
            guest.wait()
        d.stop()


def test_restarted_daemon_kills_the_workers_a_previous_run_left(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "workers").mkdir(parents=True)
    # a real worker process that no daemon owns (as one that lost its parent-death signal),
    # recorded by a daemon that is dead now
    a, b = socket.socketpair()
    orphan = subprocess.Popen(
        [sys.executable, "-m", "crane.craned.worker", "--fd", str(b.fileno())],
        pass_fds=(b.fileno(),),
        stdin=subprocess.DEVNULL,
    )
    b.close()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        start = process_start(orphan.pid)
        (run / "workers" / str(orphan.pid)).write_text(f"{orphan.pid} {start} {dead.pid}\n")
        # and a stale record whose pid is now someone else's process: left alone
        bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        (run / "workers" / str(bystander.pid)).write_text(f"{bystander.pid} 1 {dead.pid}\n")
        with DaemonProcess(run) as d:
            assert orphan.wait(5) == -signal.SIGKILL
            assert bystander.poll() is None
            assert f"killed worker pid {orphan.pid}" in d.log_text()
            assert str(bystander.pid) not in _worker_pids(run)
    finally:
        for p in (orphan, bystander):
            if p.poll() is None:
                p.kill()
                p.wait()
        a.close()


@pytest.mark.parametrize(
    ("path", "busy"), [("ring", False), ("direct", False), ("relay", False), ("ring", True)]
)
def test_killed_guest_inside_a_kernel_loses_its_worker(
    daemon: DaemonProcess, path: str, busy: bool
) -> None:
    guest, sid, worker = start_stuck_guest(daemon, path, busy)
    try:
        time.sleep(0.5)  # inside the kernel now
        with ControlClient(daemon.address) as ctl:
            [info] = ctl.sessions().sessions
            assert info.id == sid and info.state == "running"
            assert alive(worker)
            guest.kill()
            guest.wait()
            took = _gone_within([worker], 8.0)
            assert wait_for(lambda: not ctl.sessions().sessions, 2.0)
            assert ctl.devices().devices[0].used_mem == 0
        print(f"{path}: worker gone {took:.2f} s after its guest's SIGKILL")
    finally:
        if guest.poll() is None:
            guest.kill()
            guest.wait()
    log = daemon.log_text()
    assert f"session {sid} closed" in log
    closed = next(x for x in log.splitlines() if f"session {sid} closed" in x)
    # the relay's worker runs the batch on the thread that would hear the daemon: the daemon
    # kills it; the others end by themselves. A busy kernel's worker once unmapped the
    # session's memory under the kernel and died of SIGSEGV (exit status -11)
    assert ("worker exit status -9" if path == "relay" else "worker exit status 0") in closed


def _crane(daemon: DaemonProcess, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run the ``crane`` CLI against ``daemon``; its result and how long it took."""
    t0 = time.monotonic()
    cli = subprocess.run(
        [sys.executable, "-m", "crane.cli.main", "--daemon", daemon.address, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return cli, time.monotonic() - t0


def _cli_startup(daemon: DaemonProcess) -> float:
    """How long the CLI takes to start and get one answer from ``daemon`` right now: the
    deadline tests bound the refusal by the deadline plus this, measured in the same moment,
    rather than by a fixed allowance a loaded machine can outrun (a fixed 2 s was exceeded by
    3 ms on a CI-like machine at load 7)."""
    cli, took = _crane(daemon, "ps")
    assert cli.returncode == 0, cli.stderr
    return took


def _still_running_until_its_guest_dies(
    daemon: DaemonProcess, guest: subprocess.Popen, sid: str, worker: int
) -> None:
    """The refused session is whole: running as before, and its guest's death still ends it."""
    with ControlClient(daemon.address) as ctl:
        [info] = ctl.sessions().sessions
        assert info.id == sid and info.state == "running"  # as it was, not checkpointing
    assert alive(worker)
    guest.kill()
    guest.wait()
    _gone_within([worker], 8.0)


@pytest.mark.parametrize("path", ["ring", "direct", "relay"])
def test_checkpoint_of_a_stuck_session_fails_within_its_deadline(
    daemon: DaemonProcess, path: str, tmp_path: Path
) -> None:
    guest, sid, worker = start_stuck_guest(daemon, path)
    out = tmp_path / "stuck.ckpt"
    try:
        time.sleep(0.5)  # inside the kernel now
        args = ["--session", sid, "-o", str(out), "--release", "--timeout", "4"]
        startup = _cli_startup(daemon)
        cli, took = _crane(daemon, "checkpoint", *args)
        print(f"{path}: checkpoint refused in {took:.2f} s (CLI start-up {startup:.2f} s)")
        assert cli.returncode == 1 and took < 4.0 + startup + 1.5, cli.stderr
        assert f"checkpoint of session {sid} failed: checkpoint not started" in cli.stderr
        assert "did not return" in cli.stderr and "left as it was" in cli.stderr
        assert "kernel that does not finish" in cli.stderr and "Deadline Exceeded" not in cli.stderr
        assert not out.exists()
        _still_running_until_its_guest_dies(daemon, guest, sid, worker)
    finally:
        if guest.poll() is None:
            guest.kill()
            guest.wait()


@pytest.mark.parametrize("path", ["ring", "direct", "relay"])
def test_migration_of_a_stuck_session_fails_within_its_deadline(
    daemons: tuple[DaemonProcess, DaemonProcess], path: str
) -> None:
    a, b = daemons
    guest, sid, worker = start_stuck_guest(a, path)
    try:
        time.sleep(0.5)  # inside the kernel now
        startup = _cli_startup(a)
        cli, took = _crane(a, "migrate", "--session", sid, "--to", b.address, "--timeout", "3")
        print(f"{path}: migration refused in {took:.2f} s (CLI start-up {startup:.2f} s)")
        # the abort's first attempt (1 s) and the destination's pre-flight beside the deadline
        assert cli.returncode == 1 and took < 3.0 + startup + 3.0, cli.stderr[-300:]
        assert f"migration of session {sid} failed" in cli.stderr
        assert "did not return" in cli.stderr and "as it was" in cli.stderr
        with ControlClient(b.address) as ctl:
            assert not ctl.sessions().sessions
        _still_running_until_its_guest_dies(a, guest, sid, worker)
    finally:
        if guest.poll() is None:
            guest.kill()
            guest.wait()
