"""Worker processes: spawned ahead of demand, handed to sessions, reaped when done.

A worker is a fresh Python process (``python -m crane.craned.worker``), not a fork of the daemon:
forking a process that runs gRPC threads is unsafe, and a fresh process gets its own CUDA context
and address space (invariant 4). Spawning costs a few hundred milliseconds of imports, so the pool
keeps ``prespawn`` idle workers ready and a session open only waits for the configuration
round trip.

Every worker is spawned from one thread that lives as long as the daemon (``_SPAWNER``): a
worker asks the kernel to kill it when its parent goes (:mod:`crane.host.lifeline`), and Linux
delivers that signal when the *thread* that forked it exits, so a worker forked from a
short-lived thread (a prespawn, an RPC) would die with that thread instead of with craned.
Each worker is recorded in the run directory's pid files until it is reaped, so that a daemon
restarted after a crash kills the ones still running.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from crane.host.channel import Channel
from crane.host.lifeline import PidFiles

__all__ = ["WorkerPool", "WorkerProcess", "spawn", "spawner_responsive"]

log = logging.getLogger("craned")

#: The one thread that forks workers (see the module's docstring): an executor's thread stays
#: until the executor shuts down, which craned never does.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worker-spawn")
#: An idle worker alive this long after its spawn got through its start: workers can run.
WORKER_START_S = 10.0


class WorkerProcess:
    """A spawned worker and the daemon's end of its channel."""

    def __init__(
        self, log_level: str, pids: PidFiles | None = None, log_format: str = "text"
    ) -> None:
        """Spawn a worker (call it on ``_SPAWNER``'s thread: :func:`spawn`); it logs at the
        daemon's level in the daemon's format (crane.host.logs)."""
        self.channel, child = Channel.pair()
        env = dict(os.environ)
        env["CRANE_LOG_LEVEL"] = log_level
        env["CRANE_LOG_FORMAT"] = log_format
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "crane.craned.worker",
                "--fd",
                str(child.fileno()),
                "--parent",
                str(os.getpid()),
            ],
            pass_fds=(child.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        child.close()
        self.pids = pids
        if pids is not None:
            pids.add(self.proc.pid)
        self._stopped = False
        self._lock = threading.Lock()
        self.spawned = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def exited(self) -> bool:
        """Stopped by the daemon, or reaped after exiting by itself."""
        return self._stopped or self.proc.returncode is not None

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
        finally:
            if self.pids is not None:
                self.pids.remove(self.pid)


def spawn(log_level: str, pids: PidFiles | None = None, log_format: str = "text") -> WorkerProcess:
    """A new worker, forked from the spawner thread whatever thread asks."""
    return _SPAWNER.submit(WorkerProcess, log_level, pids, log_format).result()


def spawner_responsive(timeout: float) -> bool:
    """Whether the spawner thread runs a no-op within ``timeout`` seconds (a spawn that hangs,
    e.g. in a wedged exec, would block every session open behind it)."""
    try:
        _SPAWNER.submit(lambda: None).result(timeout=timeout)
    except TimeoutError:
        return False
    return True


class WorkerPool:
    """Keeps ``size`` idle workers ready."""

    def __init__(
        self, size: int, log_level: str, pids: PidFiles | None = None, log_format: str = "text"
    ) -> None:
        """``pids``: where each worker is recorded until it is reaped (the daemon's sweep)."""
        self.size = size
        self.log_level = log_level
        self.log_format = log_format
        self.pids = pids
        self._idle: list[WorkerProcess] = []
        #: Workers being spawned for the pool: counted with the idle ones, or concurrent
        #: refills (one per session opened) would each add one and the pool overshoot its size
        #: (16 sessions opened at once left 12 idle workers, ~40 MB each, for good).
        self._spawning = 0
        self._lock = threading.Lock()
        self._closed = False
        #: Why the last worker could not be had (None: the last one spawned and is alive): the
        #: daemon's health (``crane.craned.health``) reports it.
        self.failure: str | None = None
        self.refill()

    def take(self, replenish: bool = True) -> WorkerProcess:
        """An idle worker (a fresh one if none is ready). ``replenish=False``: the caller calls
        :meth:`replenish` once its time-critical start is over, so that spawning the next
        worker (hundreds of milliseconds of imports) does not compete with it for the CPU."""
        with self._lock:
            w = self._idle.pop() if self._idle else None
        if w is not None and w.proc.poll() is not None:
            self._died_idle(w)
            w = None
        if w is None:
            w = self._spawn()
        if replenish:
            self.replenish()
        return w

    def replenish(self) -> None:
        """Top the idle workers up, in the background."""
        threading.Thread(target=self.refill, name="worker-prespawn", daemon=True).start()

    def refill(self) -> None:
        while True:
            with self._lock:
                if self._closed or len(self._idle) + self._spawning >= self.size:
                    return
                self._spawning += 1
            try:
                w = self._spawn()
            finally:
                with self._lock:
                    self._spawning -= 1
            with self._lock:
                if self._closed:
                    break
                self._idle.append(w)
                continue
        w.stop()

    def _spawn(self) -> WorkerProcess:
        try:
            w = spawn(self.log_level, self.pids, self.log_format)
        except OSError as e:
            self.failure = f"cannot spawn a worker ({sys.executable} -m crane.craned.worker): {e}"
            raise
        if self.size == 0:  # no idle worker will prove workers run: a spawn has to do
            self.failure = None
        return w

    def _died_idle(self, w: WorkerProcess) -> None:
        """An idle worker exited on its own before any session used it: workers cannot run
        (their imports or start fail); reaped, and remembered as the pool's failure."""
        code = w.proc.wait()
        if w.pids is not None:
            w.pids.remove(w.pid)
        self.failure = f"an idle worker (pid {w.pid}) exited with code {code} before it was used"

    def check(self) -> str | None:
        """Why this pool cannot provide a worker (None: it can, as far as can be told without
        using one): reaps idle workers that died, tops the pool up, and asks the spawner
        thread for a no-op (a wedged spawner blocks every session open)."""
        with self._lock:
            dead = [w for w in self._idle if w.proc.poll() is not None]
            self._idle = [w for w in self._idle if w not in dead]
            closed = self._closed
            # an idle worker that outlived its start (imports, then waiting for a session)
            proven = any(time.monotonic() - w.spawned > WORKER_START_S for w in self._idle)
        if proven and not dead:
            self.failure = None
        for w in dead:
            self._died_idle(w)
        if closed:
            return "the worker pool is closed"
        if not spawner_responsive(30.0):
            return "the worker spawner thread has not answered in 30 s"
        if dead:
            self.replenish()
        return self.failure

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for w in idle:
            w.stop()
