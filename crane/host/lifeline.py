"""Workers die with their daemon: the kernel's parent-death signal, and pid files for a sweep.

A worker inside a kernel that never returns reads nothing from its channel, so it cannot notice
that craned is gone; re-parented to PID 1 it would hold its device memory (and on a GPU its
context) forever. Two mechanisms, because neither covers every case alone:

* :func:`die_with_parent`, in the worker at start: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, so the
  kernel kills the worker the moment its parent goes, whatever the worker is doing. Linux ties
  the signal to the *thread* that forked the child, not to its process, so craned spawns every
  worker from one thread that lives as long as it does (``crane.daemon.workers``).
* :class:`PidFiles`: craned records each worker it spawns (pid, the process's start time, the
  daemon's pid) in ``<run_dir>/workers``; a daemon starting on that run directory kills the
  workers of a previous run still alive (a worker that lost the signal: started before the
  prctl, or under a platform without it). The start time makes a recycled pid harmless; a
  worker whose recorded daemon is alive and still its parent is left alone (a second daemon
  started on the same run directory by mistake must not kill the first one's sessions).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
from pathlib import Path

__all__ = ["PidFiles", "die_with_parent", "process_start"]

log = logging.getLogger("craned")

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> bool:
    """Have the kernel SIGKILL this process when its parent exits; False if the parent
    (``parent``, the pid it was started by) is already gone, so the caller exits at once."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    except (OSError, AttributeError) as e:  # not Linux: the daemon's sweep still applies
        log.warning("cannot ask to die with the daemon: %s", e)
    # the parent may have died between our fork and the prctl: the signal would never come
    return os.getppid() == parent


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, None if it is gone or a
    zombie (a zombie holds nothing but its pid)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[19])


def process_start(pid: int) -> int | None:
    """A process's start time (clock ticks since boot): with its pid, a unique identity."""
    st = _stat(pid)
    return None if st is None else st[1]


def alive(pid: int) -> bool:
    """True while ``pid`` is a running (not zombie) process."""
    return _stat(pid) is not None


class PidFiles:
    """``<run_dir>/workers/<pid>``: one line ``pid start daemon_pid`` per spawned worker."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def add(self, pid: int) -> None:
        start = process_start(pid)
        if start is None:  # died already: nothing to sweep later
            return
        tmp = self.folder / f".{pid}.tmp"
        tmp.write_text(f"{pid} {start} {os.getpid()}\n")
        tmp.replace(self.folder / str(pid))

    def remove(self, pid: int) -> None:
        with contextlib.suppress(OSError):
            (self.folder / str(pid)).unlink()

    def sweep(self) -> list[int]:
        """Kill the workers a previous daemon on this run directory left alive; their pids."""
        killed: list[int] = []
        for path in self.folder.iterdir():
            try:
                pid, start, daemon = (int(x) for x in path.read_text().split())
            except (OSError, ValueError):
                path.unlink(missing_ok=True)  # a torn write: never a live worker's only record
                continue
            st = _stat(pid)
            if st is not None and st[1] == start:
                if st[0] == daemon and alive(daemon):
                    continue  # another daemon, still running, owns this worker
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    log.warning(
                        "killed worker pid %d left by a previous craned (pid %d)", pid, daemon
                    )
            path.unlink(missing_ok=True)
        return killed
