"""Two-phase switchover (``hold``): the GPU half of a VM migration, without a VM.

Two real daemons on different simulated GPU models, a guest on the host stepping a workload on
a thread. A held migration freezes the session on the source once the destination acknowledged
the final round; the destination keeps it ready but not serving (a Resume there is told to
retry, ``crane-parked``) until Commit (it serves, the source redirects) or Abort / the hold's
deadline (it is dropped there and the guest carries on at the source). Every outcome must leave
the program's result bit-identical to an unmigrated run.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from crane.cli.control_client import ControlClient
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.v1 import control_pb2, control_pb2_grpc, guest_pb2, guest_pb2_grpc
from crane.wire.channel import open_channel
from crane.wire.fingerprint import fingerprint
from tests.integration.test_migrate import STEPS, Guest, _live, _no_sessions, _wait_no_sessions
from tests.integration.workload import reference


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, ...]]:
    root = tmp_path_factory.mktemp("hold")
    out: list[DaemonProcess] = []
    try:
        for name, profile in (("src", "a100-80gb"), ("dst", "h100-80gb")):
            out.append(DaemonProcess(root / name, [f"sim:{profile}"]))
        yield tuple(out)
    finally:
        for d in out:
            d.stop()


class Held:
    """A held migration followed on a thread: every progress message, and an event per phase."""

    def __init__(self, src: str, sid: str, to: str, gate: bool = False, limit_s: float = 60):
        self.src, self.sid = src, sid
        self.progress: list[control_pb2.MigrateProgress] = []
        self.awaiting = threading.Event()
        self.held = threading.Event()
        req = control_pb2.MigrateRequest(
            session_id=sid, to=to, hold=True, gate=gate, hold_timeout_s=limit_s
        )
        self.thread = threading.Thread(target=self._follow, args=(req,), daemon=True)
        self.thread.start()

    def _follow(self, req: control_pb2.MigrateRequest) -> None:
        with open_channel(self.src) as ch:
            for p in control_pb2_grpc.MigrationStub(ch).Migrate(req):
                self.progress.append(p)
                if p.awaiting:
                    self.awaiting.set()
                if p.phase == "held" and p.awaiting:
                    self.held.set()
        self.awaiting.set()
        self.held.set()

    def decide(self, verb: str) -> str:
        with open_channel(self.src) as ch:
            stub = control_pb2_grpc.MigrationStub(ch)
            return getattr(stub, verb)(control_pb2.MigrateDecision(session_id=self.sid)).phase

    def last(self) -> control_pb2.MigrateProgress:
        self.thread.join(60)
        assert not self.thread.is_alive()
        return self.progress[-1]


def _resume_there(address: str, s: GuestSession) -> grpc.RpcError:
    """A Resume of ``s`` at ``address`` (what a VM's guest does when it reconnects early)."""
    opened = s._t.opened
    with open_channel(address) as ch, pytest.raises(grpc.RpcError) as e:
        guest_pb2_grpc.GuestStub(ch).Resume(
            guest_pb2.ResumeRequest(
                session_id=opened.session_id,
                resume_token=opened.resume_token,
                fingerprint=fingerprint(),
            ),
            timeout=10,
        )
    return e.value


def _settled(d: DaemonProcess, timeout: float = 10) -> None:
    """``d`` is empty once the session its guest just closed has finished closing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with ControlClient(d.address) as c:
            if not _live(c):
                break
        time.sleep(0.05)
    _no_sessions(d)


@contextlib.contextmanager
def _stepping(
    src: DaemonProcess, image: bytes, client: str
) -> Iterator[tuple[GuestSession, Guest]]:
    """A guest on ``src`` already a few steps into the workload."""
    with GuestSession(src.address, client=client) as s:
        g = Guest(s, image)
        g.wait_steps(5)
        yield s, g


def _frozen(g: Guest, for_s: float = 0.3) -> bool:
    before = g.steps
    time.sleep(for_s)
    return g.steps == before


def test_hold_then_abort_carries_on_at_the_source(pair: tuple, image: bytes) -> None:
    src, dst = pair
    want = reference(src.address, image, STEPS)
    with _stepping(src, image, "held-abort") as (s, g):
        m = Held(src.address, s.session_id, dst.address)
        assert m.held.wait(60), m.progress
        assert _frozen(g)  # its calls wait while held
        with ControlClient(dst.address) as c:
            (info,) = _live(c)
            assert info.id == s.session_id and info.state == "incoming"
        err = _resume_there(dst.address, s)
        assert err.code() is grpc.StatusCode.UNAVAILABLE
        assert dict(err.trailing_metadata() or ())["crane-parked"] == "1"
        with pytest.raises(grpc.RpcError) as e:
            m.decide("Stop")  # too late for a stop: the final round went
        assert e.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert m.decide("Abort") == "held"
        last = m.last()
        assert last.phase == "failed" and "aborted by the operator" in last.error
        got = g.finish()
        assert s._t.address == src.address and s._t.resumes == 0
    assert got == want
    _no_sessions(dst)


def test_gated_hold_then_commit_resumes_on_the_destination(pair: tuple, image: bytes) -> None:
    src, dst = pair
    want = reference(src.address, image, STEPS)
    gate_seen = threading.Event()
    taken = iter(range(STEPS))

    def keep_steps_for_the_gate() -> None:
        # the second half of the run waits for the gate: a fast guest otherwise ran every
        # step before the first round was over and sat at its last one (CI saw 299 == 299),
        # and "still runs while gated" had nothing left to show
        if next(taken) >= STEPS // 2:
            gate_seen.wait(60)

    with GuestSession(src.address, client="held-commit") as s:
        g = Guest(s, image, each_step=keep_steps_for_the_gate)
        g.wait_steps(5)
        m = Held(src.address, s.session_id, dst.address, gate=True)
        assert m.awaiting.wait(60), m.progress
        gate_seen.set()
        assert m.progress[-1].phase == "precopy"
        with pytest.raises(grpc.RpcError) as e:
            m.decide("Commit")  # nothing to commit before the final round
        assert e.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        running = g.steps
        time.sleep(0.2)
        assert g.steps > running  # gated: the guest still runs until the stop
        assert m.decide("Stop") == "precopy"
        assert m.held.wait(60), m.progress
        assert _frozen(g)
        assert m.decide("Commit") == "held"
        last = m.last()
        assert last.phase == "done", last.error
        assert last.switchover > 0 and last.downtime >= last.switchover
        got = g.finish()
        assert s._t.address == dst.address and s._t.resumes == 1
    assert got == want
    _wait_no_sessions(src)  # its worker is released after the switchover, on its own time
    _settled(dst)  # the guest just closed its session there


def test_hold_without_a_decision_aborts_itself(pair: tuple, image: bytes) -> None:
    src, dst = pair
    want = reference(src.address, image, STEPS)
    with _stepping(src, image, "held-expired") as (s, g):
        m = Held(src.address, s.session_id, dst.address, limit_s=1.0)
        last = m.last()
        assert last.phase == "failed" and "no Commit or Abort within 1 s" in last.error
        got = g.finish()
        assert s._t.address == src.address
    assert got == want
    _no_sessions(dst)
