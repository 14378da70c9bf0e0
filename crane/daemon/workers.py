"""Worker processes: spawned ahead of demand, handed to sessions, reaped when done.

A worker is a fresh Python process (``python -m crane.craned.worker``), not a fork of the daemon:
forking a process that runs gRPC threads is unsafe, and a fresh process gets its own CUDA context
and address space (invariant 4). Spawning costs a few hundred milliseconds of imports, so the pool
keeps ``prespawn`` idle workers ready and a session open only waits for the configuration
round trip.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

from crane.host.channel import Channel

__all__ = ["WorkerPool", "WorkerProcess"]

log = logging.getLogger("craned")


class WorkerProcess:
    """A spawned worker and the daemon's end of its channel."""

    def __init__(self, log_level: str) -> None:
        self.channel, child = Channel.pair()
        env = dict(os.environ)
        env["CRANE_LOG_LEVEL"] = log_level
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "crane.craned.worker", "--fd", str(child.fileno())],
            pass_fds=(child.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        child.close()
        self._stopped = False
        self._lock = threading.Lock()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 3.0) -> int | None:
        """Close the channel (the worker exits and frees its device state), then reap it."""
        with self._lock:
            if self._stopped:
                return self.proc.returncode
            self._stopped = True
        self.channel.close()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("worker %d did not exit in %.0f s; killing it", self.pid, timeout)
            self.proc.kill()
            return self.proc.wait()


class WorkerPool:
    """Keeps ``size`` idle workers ready."""

    def __init__(self, size: int, log_level: str) -> None:
        self.size = size
        self.log_level = log_level
        self._idle: list[WorkerProcess] = []
        self._lock = threading.Lock()
        self._closed = False
        self.refill()

    def take(self, replenish: bool = True) -> WorkerProcess:
        """An idle worker (a fresh one if none is ready). ``replenish=False``: the caller calls
        :meth:`replenish` once its time-critical start is over, so that spawning the next
        worker (hundreds of milliseconds of imports) does not compete with it for the CPU."""
        with self._lock:
            w = self._idle.pop() if self._idle else None
        if w is None or w.proc.poll() is not None:
            w = WorkerProcess(self.log_level)
        if replenish:
            self.replenish()
        return w

    def replenish(self) -> None:
        """Top the idle workers up, in the background."""
        threading.Thread(target=self.refill, name="worker-prespawn", daemon=True).start()

    def refill(self) -> None:
        while True:
            with self._lock:
                if self._closed or len(self._idle) >= self.size:
                    return
            w = WorkerProcess(self.log_level)
            with self._lock:
                if self._closed:
                    break
                self._idle.append(w)
                continue
        w.stop()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for w in idle:
            w.stop()
