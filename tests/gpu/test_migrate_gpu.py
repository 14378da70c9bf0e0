"""Checkpoint/restore and live migration between two craned on the one GPU, bit-identical.

Two kinds of guest: the integration suite's workload through the Python session library
(device pointers stored in device memory, a module variable, streams and events; compared with
an unmoved run on the same GPU), and an unmodified nvcc-built program under ``crane run``
(tests/gpu/programs/iterate.cu: a ballast buffer, a pointer table the kernels follow and swap,
a ``__device__`` counter; compared with the same program run natively).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from crane.cli.control_client import ControlClient
from crane.cli.migrate import migrate
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from tests.gpu.conftest import GPU_PROGRAMS
from tests.gpu.harness import Run, Target, crane_argv, output_mismatch, system_env
from tests.integration.workload import SRC, Workload

pytestmark = pytest.mark.gpu


def _steps(target: Target) -> int:
    return 60 if target.simulated else 300


def _iterate_args(target: Target) -> list[str]:
    # steps, pause per step (us), ballast MiB: long enough on both sides for a move mid-run
    return ["150", "2000", "1"] if target.simulated else ["4000", "1000", "256"]


@pytest.fixture(scope="module")
def image(gpu_build) -> bytes:  # type: ignore[no-untyped-def]
    return gpu_build(SRC, "-fatbin", suffix=".fatbin").read_bytes()


@pytest.fixture(scope="module")
def iterate(gpu_build) -> Path:  # type: ignore[no-untyped-def]
    return gpu_build(GPU_PROGRAMS / "iterate.cu")


def reference(address: str, image: bytes, steps: int) -> tuple[bytes, bytes, int]:
    with GuestSession(address, client="reference") as s:
        w = Workload(s, image)
        w.run(steps)
        return w.result()


class Stepper:
    """The workload on a thread, stepping (1 ms apart) until told where to stop: the test moves
    the session while it runs, then compares with an unmoved run of as many steps."""

    def __init__(self, s: GuestSession, image: bytes) -> None:
        self.w, self.steps, self.stop_at = Workload(s, image), 0, -1
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while self.stop_at < 0 or self.steps < self.stop_at:
                self.w.run(1)
                self.steps += 1
                time.sleep(0.001)
        except BaseException as e:
            self.error = e

    def wait_steps(self, n: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.steps < n and self.error is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert self.error is None, self.error
        assert self.steps >= n, f"only {self.steps} steps in {timeout} s"

    def finish(self, more: int) -> tuple[int, tuple[bytes, bytes, int]]:
        self.stop_at = self.steps + more
        self.thread.join(300)
        assert self.error is None, self.error
        return self.steps, self.w.result()


def _session_ids(d: DaemonProcess) -> set[str]:
    """Sessions holding a worker: a moved session's redirect entry and a released (parked)
    session's record hold nothing on the GPU, and expire by themselves."""
    with ControlClient(d.address) as c:
        return {s.id for s in c.sessions().sessions if s.state not in ("migrated", "parked")}


def test_checkpoint_restore_on_the_other_daemon_is_bit_identical(
    target: Target, daemon_a: DaemonProcess, daemon_b: DaemonProcess, image: bytes, tmp_path: Path
) -> None:
    steps = _steps(target)
    want = reference(daemon_a.address, image, steps)
    ckpt = "s.ckpt"  # in the daemons' checkpoint directory
    with GuestSession(daemon_a.address, client="gpu-ckpt", alternates=[daemon_b.address]) as s:
        w = Workload(s, image)
        w.run(steps // 2)
        window = s.va_window
        with ControlClient(daemon_a.address, timeout=None) as c:
            r = c.checkpoint(s.session_id, str(ckpt), release=True)
            assert r.state == "parked"
        with ControlClient(daemon_b.address, timeout=None) as c:
            c.restore(str(ckpt))
        w.run(steps - steps // 2)  # resumes on B by itself
        got = w.result()
        assert s.va_window == window
        assert s._t.address == daemon_b.address and s._t.resumes == 1
    assert got[2] == want[2] == steps
    assert got == want, "the restored session's memory differs from the unmoved run"


def test_live_migration_there_and_back_is_bit_identical(
    target: Target, daemon_a: DaemonProcess, daemon_b: DaemonProcess, image: bytes
) -> None:
    """A -> B -> A mid-run: the return trip re-places the same addresses in a fresh worker on
    a GPU that the first worker (now gone) used for them."""
    with GuestSession(daemon_a.address, client="gpu-migrate") as s:
        window = s.va_window
        g = Stepper(s, image)
        here = daemon_a
        for there in (daemon_b, daemon_a):
            g.wait_steps(g.steps + 10)
            last = migrate(here.address, s.session_id, there.address)[-1]
            assert last.phase == "done", last.error
            assert 0 < last.downtime <= last.total
            assert g.thread.is_alive() and g.error is None, g.error
            here = there
        steps, got = g.finish(10)
        assert s.va_window == window and s._t.resumes == 2
    assert got[2] == steps
    assert got == reference(daemon_a.address, image, steps), (
        "the migrated session's memory differs from an unmoved run"
    )
    assert s.session_id not in _session_ids(daemon_b)


class Program:
    """``iterate`` under ``crane run`` on daemon A, its output read on threads as it comes."""

    def __init__(self, exe: Path, args: list[str], a: DaemonProcess, env: dict[str, str]) -> None:
        full = system_env()
        full.update(env)
        self.proc = subprocess.Popen(
            crane_argv(a.address, [exe, *args]),
            env=full,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.err: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.readers = [
            threading.Thread(target=self.lines.extend, args=(self.proc.stdout,), daemon=True),
            threading.Thread(target=self.err.extend, args=(self.proc.stderr,), daemon=True),
        ]
        for t in self.readers:
            t.start()

    def wait_line(self, prefix: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not any(ln.startswith(prefix) for ln in self.lines):
            assert self.readers[0].is_alive(), f"the program ended (exit {self.proc.poll()})"
            assert time.monotonic() < deadline, f"no {prefix!r} line in {timeout} s"
            time.sleep(0.01)

    def session_id(self, d: DaemonProcess, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with ControlClient(d.address) as c:
                # crane run execs the program: its pid is the one the interposer reports
                mine = [s.id for s in c.sessions().sessions if f"pid {self.proc.pid}" in s.client]
            if len(mine) == 1:
                return mine[0]
            time.sleep(0.05)
        raise AssertionError(f"no session of pid {self.proc.pid} on {d.address}")

    def finish(self, timeout: float = 300) -> tuple[int, str, str]:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for t in self.readers:
            t.join(10)
        return self.proc.returncode, "".join(self.lines), "".join(self.err)


def _check_against_native(native, exe: Path, args: list[str], code: int, out: str, err: str):  # type: ignore[no-untyped-def]
    ref = native([exe, *args])
    assert ref.returncode == 0 and "result" in ref.stdout, ref.describe()
    problem = output_mismatch(ref, Run([str(exe), *args], code, out, err, 0.0))
    assert problem is None, problem


@pytest.fixture
def no_leftovers(daemon_a: DaemonProcess, daemon_b: DaemonProcess) -> Iterator[None]:
    before = _session_ids(daemon_a) | _session_ids(daemon_b)
    yield
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = (_session_ids(daemon_a) | _session_ids(daemon_b)) - before
        if not left:
            return
        time.sleep(0.1)
    with ControlClient(daemon_a.address) as ca, ControlClient(daemon_b.address) as cb:
        states = [(s.id, s.state, s.location) for c in (ca, cb) for s in c.sessions().sessions]
    raise AssertionError(f"sessions left behind: {left}: {states}")


def test_program_migrated_live_matches_native(
    target: Target,
    daemon_a: DaemonProcess,
    daemon_b: DaemonProcess,
    iterate: Path,
    native,  # type: ignore[no-untyped-def]
    no_leftovers: None,
) -> None:
    args = _iterate_args(target)
    prog = Program(iterate, args, daemon_a, {})
    try:
        prog.wait_line("step 0")
        sid = prog.session_id(daemon_a)
        time.sleep(0.2)
        last = migrate(daemon_a.address, sid, daemon_b.address)[-1]
        assert last.phase == "done", last.error
        assert prog.proc.poll() is None, "the program ended before the move finished"
        assert sid in _session_ids(daemon_b)
    finally:
        code, out, err = prog.finish()
    assert code == 0, err[-2000:]
    _check_against_native(native, iterate, args, code, out, err)


def test_program_checkpointed_and_restored_elsewhere_matches_native(
    target: Target,
    daemon_a: DaemonProcess,
    daemon_b: DaemonProcess,
    iterate: Path,
    native,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    no_leftovers: None,
) -> None:
    args = _iterate_args(target)
    prog = Program(iterate, args, daemon_a, {"CRANE_DAEMON_ALTERNATES": daemon_b.address})
    ckpt = "prog.ckpt"  # in the daemons' checkpoint directory
    try:
        prog.wait_line("step 0")
        sid = prog.session_id(daemon_a)
        time.sleep(0.2)
        with ControlClient(daemon_a.address, timeout=None) as c:
            assert c.checkpoint(sid, str(ckpt), release=True).state == "parked"
        parked_at = len(prog.lines)
        time.sleep(0.5)
        assert len(prog.lines) == parked_at, "the program kept running while parked"
        with ControlClient(daemon_b.address, timeout=None) as c:
            c.restore(str(ckpt))
    finally:
        code, out, err = prog.finish()
    assert code == 0, err[-2000:]
    _check_against_native(native, iterate, args, code, out, err)
