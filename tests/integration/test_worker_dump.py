"""``kill -USR1`` of a worker writes its threads' stacks into craned's log and changes nothing
else: how an operator (and a test that saw a guest hang) finds where a session waits."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from tests.integration.procs import worker_processes


def test_sigusr1_dumps_a_workers_threads_and_the_session_carries_on(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path / "run", prespawn=0) as d, GuestSession(d.address) as s:
        p = s.mem_alloc(1 << 12)
        s.memset_d8(p, 7, 1 << 12)
        (pid,) = worker_processes(d.proc.pid)
        os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while "most recent call first" not in d.log_text():
            assert time.monotonic() < deadline, d.log_text()[-2000:]
            time.sleep(0.05)
        assert 'File "' in d.log_text()
        assert s.memcpy_dtoh(p, 1 << 12) == b"\x07" * (1 << 12)  # the worker lives on
