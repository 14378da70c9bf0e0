"""Pid files and the start-up sweep (crane.host.lifeline) against real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from crane.host.lifeline import PidFiles, alive, die_with_parent, process_start


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_sweep_kills_a_dead_daemons_worker_and_spares_everything_else(tmp_path: Path) -> None:
    pids = PidFiles(tmp_path / "workers")
    orphan, mine, recycled = _sleeper(), _sleeper(), _sleeper()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        folder = tmp_path / "workers"
        (folder / str(orphan.pid)).write_text(
            f"{orphan.pid} {process_start(orphan.pid)} {dead.pid}"
        )
        pids.add(mine.pid)  # recorded by this process, alive and its parent: a live daemon's
        # the record's start time is not this process's: the pid was reused by someone else
        (folder / str(recycled.pid)).write_text(f"{recycled.pid} 1 {dead.pid}")
        (folder / "torn").write_text("12")
        assert pids.sweep() == [orphan.pid]
        assert orphan.wait(5) == -signal.SIGKILL
        assert mine.poll() is None and recycled.poll() is None
        assert sorted(p.name for p in folder.iterdir()) == [str(mine.pid)]
    finally:
        for p in (orphan, mine, recycled):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_zombie_is_not_alive_and_the_parent_check_sees_a_wrong_parent() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    while alive(p.pid):  # exits, and stays a zombie until waited for
        pass
    assert process_start(p.pid) is None
    p.wait()
    assert die_with_parent(os.getppid())
    assert not die_with_parent(os.getpid())  # not our parent: the caller must exit
