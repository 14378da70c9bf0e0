"""Live migration between real daemons on different simulated GPU models.

The guest runs a stencil-like iteration (each step depends on the last, device pointers kept in
device memory, a module variable counting steps) on a thread while the session moves; the
final result must be bit-identical to an unmigrated run, and a failed or refused migration must
leave the program running where it was with nothing leaked on either daemon.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from crane.cli.control_client import ControlClient
from crane.cli.main import main as crane_main
from crane.cli.migrate import migrate
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.migrate.daemon_side import TEST_DELAY_FINAL_ACK_ENV
from crane.v1 import control_pb2, control_pb2_grpc
from crane.wire.channel import open_channel
from tests.integration.net import CutProxy, tcp_address
from tests.integration.procs import where_stuck
from tests.integration.workload import Workload, reference

STEPS = 300


@pytest.fixture
def trio(tmp_path: Path) -> Iterator[list[DaemonProcess]]:
    out: list[DaemonProcess] = []
    try:
        for name, profile in (("l", "l4"), ("a", "a100-40gb"), ("h", "h100-80gb")):
            out.append(DaemonProcess(tmp_path / name, [f"sim:{profile}"]))
        yield out
    finally:
        for d in out:
            d.stop()


class Guest:
    """The workload on a thread, stepping until told how many steps in all."""

    def __init__(
        self,
        s: GuestSession,
        image: bytes,
        pause_at: int | None = None,
        each_step: Callable[[], None] | None = None,
    ) -> None:
        """``pause_at``: wait before that step until :attr:`go` is set (so a test can be sure
        the program is mid-run when it cuts in, however fast the machine). ``each_step``: more
        work the program does before every step."""
        self.w = Workload(s, image)
        self.each_step = each_step
        self.steps = 0
        self.error: BaseException | None = None
        self.pause_at = pause_at
        self.go = threading.Event()
        if pause_at is None:
            self.go.set()
        # the last step waits for finish(): a fast machine (the call ring) otherwise ran all
        # the steps before a migration under test was over, and "moved mid-run" failed
        self.last = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while self.steps < STEPS:
                if self.steps == self.pause_at:
                    self.go.wait()
                if self.steps == STEPS - 1:
                    self.last.wait()
                if self.each_step is not None:
                    self.each_step()
                self.w.run(1)
                self.steps += 1
        except BaseException as e:
            self.error = e

    def wait_steps(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.steps < n and self.error is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.error is None, self.error

    def finish(self, daemons: Sequence[DaemonProcess] = ()) -> tuple[bytes, bytes, int]:
        """The result once every step ran; ``daemons``: whose workers' stacks to report if
        the guest's thread does not finish."""
        self.go.set()
        self.last.set()
        self.thread.join(120)
        assert not self.thread.is_alive(), (
            f"the guest did not finish (step {self.steps}):\n{where_stuck(self.thread, daemons)}"
        )
        assert self.error is None, self.error
        return self.w.result()


def _live(c: ControlClient) -> list:
    """The sessions a daemon serves (not the entries of those that migrated away, which only
    redirect their guests and hold nothing)."""
    return [x for x in c.sessions().sessions if x.state != "migrated"]


def _no_sessions(d: DaemonProcess) -> None:
    """Nothing runs on ``d`` and it holds no device memory."""
    with ControlClient(d.address) as c:
        assert _live(c) == []
        assert all(x.used_mem == 0 for x in c.devices().devices)


def test_migrate_mid_run_is_bit_identical(trio: list[DaemonProcess], image: bytes) -> None:
    l4, a100, _ = trio
    want = reference(l4.address, image, STEPS)
    with GuestSession(l4.address, client="moving") as s:
        g = Guest(s, image)
        g.wait_steps(5)
        assert (
            crane_main(
                ["--daemon", l4.address, "migrate", "--session", s.session_id, "--to", a100.address]
            )
            == 0
        )
        assert g.steps < STEPS  # it moved mid-run
        got = g.finish()
        assert s._t.address == a100.address and s._t.resumes == 1
    assert got == want
    # the source releases its worker after the switchover, on its own time: a move that hands
    # the memory over is over so fast that the guest can finish before that release is
    _wait_no_sessions(l4)


def test_back_and_forth_across_three_models(trio: list[DaemonProcess], image: bytes) -> None:
    l4, a100, h100 = trio
    want = reference(l4.address, image, STEPS)
    with GuestSession(l4.address, client="tour") as s:
        window = s.va_window
        g = Guest(s, image)
        here = l4
        for i, there in enumerate((a100, h100, l4)):
            g.wait_steps(4 + 8 * i)
            last = migrate(here.address, s.session_id, there.address)[-1]
            assert last.phase == "done", last.error
            assert last.downtime > 0 and last.total >= last.downtime
            with ControlClient(there.address) as c:
                (info,) = _live(c)
                assert info.id == s.session_id and info.va_base == window[0]
            here = there
        got = g.finish()
        assert s.va_window == window
    assert got == want
    for d in (a100, h100):
        _wait_no_sessions(d)


def test_destination_killed_during_precopy_finishes_on_source(tmp_path: Path, image: bytes) -> None:
    src = DaemonProcess(tmp_path / "s", ["sim:h100-80gb"])
    dst = DaemonProcess(tmp_path / "d", ["sim:h100-80gb"])
    try:
        want = reference(src.address, image, STEPS)
        with GuestSession(src.address, client="stays") as s:
            big = s.mem_alloc(256 << 20)  # gives pre-copy something to chew on
            s.memset_d8(big, 1, 256 << 20)
            g = Guest(s, image)
            g.wait_steps(3)
            out: list = []
            copying = threading.Event()

            def follow() -> None:
                """The migration's progress; the destination dies once pre-copy is under way
                (at a fixed delay instead, a fast machine finished the migration first)."""
                req = control_pb2.MigrateRequest(
                    session_id=s.session_id, to=dst.address, max_rounds=30, stop_bytes=1
                )
                with open_channel(src.address) as ch:
                    for p in control_pb2_grpc.MigrationStub(ch).Migrate(req):
                        out.append(p)
                        if p.phase == "precopy":
                            copying.set()
                copying.set()

            t = threading.Thread(target=follow)
            t.start()
            assert copying.wait(30)
            dst.stop(9)
            t.join(60)
            assert out and out[-1].phase == "failed"
            assert g.finish([src]) == want
            with ControlClient(src.address) as c:
                (info,) = c.sessions().sessions
                assert info.state in ("ready", "running") and not info.location
    finally:
        src.stop()
        dst.stop()


def test_refused_for_a_model_that_cannot_run_the_module(
    trio: list[DaemonProcess], image_sm90_only: bytes, image: bytes
) -> None:
    _, a100, h100 = trio
    with GuestSession(h100.address) as s:
        s.module_load(image_sm90_only)
        last = migrate(h100.address, s.session_id, a100.address)[-1]
        assert last.phase == "failed"
        assert "no usable code" in last.error and "sm_80" in last.error, last.error
        assert "max shared memory per block (opt-in)" in last.error  # H100 told more than A100
        s.synchronize()  # unaffected
        with ControlClient(h100.address) as c:
            (info,) = c.sessions().sessions
            assert info.state in ("ready", "running")
    _no_sessions(a100)


def _children(pid: int) -> set[int]:
    """Direct child processes of ``pid`` (Linux /proc; the daemon's session workers)."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            out |= {int(c) for c in (task / "children").read_text().split()}
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie is gone for our purposes
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return False
    return True


def test_destination_killed_during_switchover_finishes_on_source(
    tmp_path: Path, image: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The destination dies after committing the session but before its final acknowledgement
    reaches the source (widened with the test-only delay): the source is still authoritative, so
    the guest, stopped for the switchover, resumes there and finishes bit-identically, and the
    dead destination leaves no worker behind."""
    src = DaemonProcess(tmp_path / "s", ["sim:h100-80gb"])
    monkeypatch.setenv(TEST_DELAY_FINAL_ACK_ENV, "20")
    dst = DaemonProcess(tmp_path / "d", ["sim:h100-80gb"])
    monkeypatch.delenv(TEST_DELAY_FINAL_ACK_ENV)
    workers: set[int] = set()
    try:
        want = reference(src.address, image, STEPS)
        with GuestSession(src.address, client="stays") as s:
            g = Guest(s, image)
            g.wait_steps(5)
            out: list = []
            t = threading.Thread(
                target=lambda: out.extend(migrate(src.address, s.session_id, dst.address))
            )
            t.start()
            deadline = time.monotonic() + 60
            while "delaying the final acknowledgement" not in dst.log_text():
                assert time.monotonic() < deadline, "the destination never reached the hook"
                assert t.is_alive(), out[-1].error if out else "migration ended early"
                time.sleep(0.01)
            stalled_at = g.steps
            time.sleep(0.2)
            assert g.steps == stalled_at  # the guest is quiesced: this is the switchover
            workers = _children(dst.proc.pid)
            assert workers, "the destination should hold the incoming session's worker"
            dst.stop(9)
            t.join(60)
            assert out and out[-1].phase == "failed", out[-1] if out else "no progress"
            assert g.finish() == want
            with ControlClient(src.address) as c:
                (info,) = c.sessions().sessions
                assert info.id == s.session_id and info.state in ("ready", "running")
                assert not info.location
            assert s._t.address == src.address and s._t.resumes == 0
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p for p in workers if _alive(p)], "the dead destination's worker lingers"
        _wait_no_sessions(src)
    finally:
        for p in workers:  # only the workers this test's destination started
            with contextlib.suppress(ProcessLookupError):
                if _alive(p):
                    os.kill(p, signal.SIGKILL)
        src.stop()
        dst.stop()


def _wait_no_sessions(d: DaemonProcess, timeout: float = 10) -> None:
    """Like :func:`_no_sessions`, allowing the daemon a moment to notice a guest's close."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _no_sessions(d)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_migrate_while_a_neighbour_keeps_running(trio: list[DaemonProcess], image: bytes) -> None:
    """Moving one session must not disturb another on the same daemon (own worker, own window):
    both finish bit-identically, the neighbour never reconnects, the mover ends up alone."""
    l4, a100, _ = trio
    want = reference(l4.address, image, STEPS)
    with (
        GuestSession(l4.address, client="moving") as s,
        GuestSession(l4.address, client="neighbour") as n,
    ):
        gs, gn = Guest(s, image), Guest(n, image)
        gs.wait_steps(5)
        gn.wait_steps(5)
        last = migrate(l4.address, s.session_id, a100.address)[-1]
        assert last.phase == "done", last.error
        assert gs.steps < STEPS and gn.steps < STEPS  # both moved / ran mid-run
        with ControlClient(l4.address) as c:
            (info,) = _live(c)
            assert info.id == n.session_id and info.state in ("ready", "running")
        with ControlClient(a100.address) as c:
            (info,) = c.sessions().sessions
            assert info.id == s.session_id
        assert gs.finish() == want
        assert gn.finish() == want
        assert s._t.address == a100.address and s._t.resumes == 1
        assert n._t.address == l4.address and n._t.resumes == 0
    _wait_no_sessions(l4)
    _wait_no_sessions(a100)


# ---- the daemon-to-daemon connection cut mid-transfer; guests on the daemon's relay path -------

#: Incompressible device memory: what each round puts on the wire is then known to the byte.
BIG = 32 << 20


def _fill_random(s: GuestSession) -> int:
    big = s.mem_alloc(BIG)
    s.memcpy_htod(big, os.urandom(BIG))
    return big


def _finishes_on_source(g: Guest, src: DaemonProcess, want: tuple[bytes, bytes, int]) -> None:
    """After a failed migration: the session is served by ``src`` as if none had been tried,
    and the program finishes there bit-identically, never having left."""
    s = g.w.s
    with ControlClient(src.address) as c:
        (info,) = c.sessions().sessions
    assert info.id == s.session_id and info.state in ("ready", "running") and not info.location
    assert g.finish() == want
    assert s._t.address == src.address and s._t.resumes == 0


def _nothing_left(src: DaemonProcess, dst: DaemonProcess) -> None:
    """The destination dropped what it had received; once the guest closed, neither daemon
    holds a session or device memory."""
    _wait_log(dst, "ended before switchover; released")
    _wait_no_sessions(dst)
    _wait_no_sessions(src)


def _wait_held(proxy: CutProxy, migration: threading.Thread, dst: DaemonProcess) -> None:
    """Until the transfer reaches the proxy's hold (failing early if the migration ended) and
    the destination holds device memory for the incoming session (what a cut must free)."""
    deadline = time.monotonic() + 60
    while not proxy.holding.wait(0.02):
        assert migration.is_alive(), "the migration ended before its transfer reached the hold"
        assert time.monotonic() < deadline, "the transfer never reached the hold"
    while True:
        with ControlClient(dst.address) as c:
            if any(d.used_mem for d in c.devices().devices):
                return
        assert time.monotonic() < deadline, "the destination never took the incoming memory"
        time.sleep(0.02)


def _wait_log(d: DaemonProcess, text: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while text not in d.log_text():
        assert time.monotonic() < deadline, f"{text!r} not in the log"
        time.sleep(0.02)


def test_connection_cut_during_precopy_finishes_on_source(
    in_stream: None,
    daemons: tuple[DaemonProcess, DaemonProcess],
    image: bytes,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The daemons' connection is cut (both sides closed, reconnects refused) in the middle of
    the first pre-copy round while the program runs: ``crane migrate`` fails naming the round,
    the program finishes on the source bit-identically, neither daemon keeps a session."""
    dst, src = daemons  # A100 -> H100 (the H100 offers every limit the A100 told)
    want = reference(src.address, image, STEPS)
    with (
        GuestSession(src.address, client="cut") as s,
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
        g.go.set()
        g.wait_steps(15)  # the program runs on during pre-copy
        with ControlClient(src.address) as c:
            (info,) = c.sessions().sessions
        assert info.state == "migrating" and info.location == f"-> {proxy.address}"
        proxy.close()  # the cut: 20 MiB into a 32 MiB round
        t.join(60)
        assert rc == [1]
        err = capsys.readouterr().err
        assert (
            f"migration of session {s.session_id} failed: destination failed in round 0: "
            "UNAVAILABLE" in err
        ), err
        _finishes_on_source(g, src, want)
    _nothing_left(src, dst)


def test_connection_cut_during_the_final_round_finishes_on_source(
    in_stream: None, daemons: tuple[DaemonProcess, DaemonProcess], image: bytes
) -> None:
    """The cut lands inside the stop-and-copy round, by byte count: one pre-copy round carries
    the random 32 MiB, and the final round carries it again (the program writes to it every
    step), so a cut at 48 MiB is in the middle of the final round. The guest, quiesced for the
    switchover, resumes on the source and finishes bit-identically; the destination drops the
    half-received session."""
    dst, src = daemons  # A100 -> H100 (the H100 offers every limit the A100 told)
    want = reference(src.address, image, STEPS)
    with (
        GuestSession(src.address, client="cut-final") as s,
        CutProxy(tcp_address(dst), hold_at=BIG * 5 // 8, cut_at=BIG + BIG // 2) as proxy,
    ):
        big = _fill_random(s)
        g = Guest(s, image, pause_at=10, each_step=lambda: s.memset_d8(big, 7, 1))
        g.wait_steps(10)
        out: list = []
        t = threading.Thread(
            target=lambda: out.extend(
                # one pre-copy round, then the final one (the dirty set is under stop_bytes)
                migrate(src.address, s.session_id, proxy.address, max_rounds=2, stop_bytes=BIG)
            )
        )
        t.start()
        _wait_held(proxy, t, dst)
        g.go.set()
        g.wait_steps(12, timeout=15)  # the program ran (and wrote) during pre-copy
        proxy.release()
        t.join(60)
        assert proxy.cut.is_set() and out, "the transfer ended before the cut"
        assert out[-1].phase == "failed", out[-1]
        assert "destination failed in round 1: UNAVAILABLE" in out[-1].error, out[-1].error
        _finishes_on_source(g, src, want)
        assert s.memcpy_dtoh(big, 1) == b"\x07"  # the program's writes stand
    _nothing_left(src, dst)


@pytest.mark.parametrize("via", ["unix-relay", "tcp"])
def test_migrate_a_guest_on_the_relay_path(
    daemons: tuple[DaemonProcess, DaemonProcess], image: bytes, via: str
) -> None:
    """A guest whose calls go through the daemon (not the worker's socket): a local one that
    asks for the relay, or one reaching the daemons over TCP, as a VM behind a forwarded port
    does. It moves mid-run, follows the redirect, stays on the relay there and finishes
    bit-identically."""
    dst, src = daemons  # A100 -> H100
    want = reference(src.address, image, STEPS)
    if via == "tcp":
        here, there, direct = tcp_address(src), tcp_address(dst), None
    else:
        here, there, direct = src.address, dst.address, False
    with GuestSession(here, client="relayed", direct=direct) as s:
        assert s._t.path == "relay"
        g = Guest(s, image)
        g.wait_steps(5)
        last = migrate(src.address, s.session_id, there)[-1]
        assert last.phase == "done", last.error
        assert g.steps < STEPS  # it moved mid-run
        got = g.finish()
        assert s._t.address == there and s._t.resumes == 1 and s._t.path == "relay"
        with ControlClient(dst.address) as c:
            (info,) = c.sessions().sessions
        assert info.id == s.session_id and info.state == "running" and info.peer
    assert got == want
    _wait_no_sessions(src)
    _wait_no_sessions(dst)
    # a relayed batch that waited out the stop-and-copy met a parked session: the source's
    # worker must refuse it quietly (the guest resends it to the destination), not crash
    assert "Traceback" not in src.log_text()
