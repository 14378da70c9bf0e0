"""What is left of a daemon's workers: the processes themselves and the daemon's records."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from crane.craned.launcher import DaemonProcess
from crane.host.lifeline import alive

__all__ = ["recorded_workers", "where_stuck", "worker_processes"]


def worker_processes(daemon_pid: int) -> list[int]:
    """Live worker processes started by ``daemon_pid`` (``crane.craned.worker --parent PID``),
    found in /proc whether or not the daemon still records them."""
    want = ["-m", "crane.craned.worker"]
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if args[1:3] != want or "--parent" not in args:
            continue
        parent = args[args.index("--parent") + 1]
        if parent == str(daemon_pid) and alive(int(proc.name)):
            out.append(int(proc.name))
    return out


def recorded_workers(run_dir: Path) -> list[int]:
    """Live workers listed in ``<run_dir>/workers``."""
    folder = run_dir / "workers"
    return [int(p.name) for p in folder.iterdir() if p.name.isdigit() and alive(int(p.name))]


def where_stuck(thread: threading.Thread, daemons: Sequence[DaemonProcess] = ()) -> str:
    """For a test whose guest thread did not finish: that thread's stack, and each daemon's
    workers' stacks (``SIGUSR1``: the worker's faulthandler writes them into craned's log)
    with the log's tail, so that a hang seen once in CI says where it waited."""
    frame = sys._current_frames().get(thread.ident or -1)
    out = ["guest thread:", "".join(traceback.format_stack(frame)) if frame else "(gone)"]
    for d in daemons:
        for pid in worker_processes(d.proc.pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGUSR1)
    time.sleep(1.0)
    for d in daemons:
        with contextlib.suppress(OSError):
            out += [f"--- {d.log_path} (tail)", *d.log_text().splitlines()[-150:]]
    return "\n".join(out)
