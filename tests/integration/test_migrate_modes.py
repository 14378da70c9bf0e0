"""How a live migration spends its rounds, and what it reports as downtime.

``max_rounds=1`` (``crane migrate --no-precopy``) is a true stop-and-copy: nothing moves while
the guest runs, the one round carries the whole session. With pre-copy, a write set the guest
rewrites every step never shrinks, so the rounds stop after it was sent once instead of
resending it until they run out. The downtime reported runs from the stop to the moment the
source daemon can redirect the guest, so it covers the destination's acknowledgement.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from crane.cli.migrate import migrate
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession

MiB = 1 << 20
#: How the copy spends its rounds: daemons of one host would hand the memory over instead
#: (tests/integration/test_migrate_handover.py), so these use the data plane.
pytestmark = pytest.mark.usefixtures("copy_on_one_host")


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    a = DaemonProcess(tmp_path / "a", ["sim:h100-80gb"])
    b = DaemonProcess(tmp_path / "b", ["sim:h100-80gb"])
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


class Rewriter:
    """A guest rewriting ``buf`` from a rotating part of ``src`` every step, on a thread."""

    def __init__(self, s: GuestSession, src: int, src_size: int, buf: int, size: int) -> None:
        self.s, self.src, self.span, self.buf, self.size = s, src, src_size - size, buf, size
        self.steps = 0
        self.last = src
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                at = self.src + (self.steps * 4096 * 7) % self.span
                self.s.memcpy_dtod(self.buf, at, self.size)
                self.s.synchronize()
                self.last = at
                self.steps += 1
                time.sleep(0.002)
        except BaseException as e:
            self.error = e

    def wait(self, n: int) -> None:
        deadline = time.monotonic() + 60
        while self.steps < n and self.error is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert self.error is None, self.error

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(60)
        assert self.error is None, self.error


def _session(s: GuestSession, size: int) -> tuple[int, bytes]:
    data = np.random.default_rng(3).standard_normal(size // 4).astype(np.float32).tobytes()
    src = s.mem_alloc(size)
    s.memcpy_htod(src, data)
    s.synchronize()
    return src, data


def test_no_precopy_moves_everything_while_stopped(pair: tuple[DaemonProcess, ...]) -> None:
    a, b = pair
    with GuestSession(a.address, client="stop-and-copy") as s:
        src, data = _session(s, 16 * MiB)
        buf = s.mem_alloc(MiB)
        g = Rewriter(s, src, 16 * MiB, buf, MiB)
        g.wait(5)
        progress = migrate(a.address, s.session_id, b.address, max_rounds=1)
        last = progress[-1]
        assert last.phase == "done", last.error
        assert last.round == 0  # one round: the stopped one
        assert not [p for p in progress if p.phase == "precopy"]
        assert last.memory_bytes >= 17 * MiB  # all of it, in that round
        assert 0 < last.downtime <= last.total
        g.wait(g.steps + 5)
        g.finish()
        assert s._t.address == b.address and s._t.resumes == 1
        assert s.memcpy_dtoh(src, 16 * MiB) == data
        assert s.memcpy_dtoh(buf, MiB) == s.memcpy_dtoh(g.last, MiB)


def test_precopy_stops_when_the_write_set_does_not_shrink(
    pair: tuple[DaemonProcess, ...],
) -> None:
    a, b = pair
    with GuestSession(a.address, client="rewriter") as s:
        src, data = _session(s, 32 * MiB)
        buf = s.mem_alloc(8 * MiB)
        g = Rewriter(s, src, 32 * MiB, buf, 8 * MiB)
        g.wait(5)
        last = migrate(a.address, s.session_id, b.address, max_rounds=8, stop_bytes=1)[-1]
        assert last.phase == "done", last.error
        # round 0, at most one round of the write set, then the stop; never all 8 rounds
        assert last.round <= 2, last
        g.wait(g.steps + 5)
        g.finish()
        assert s._t.address == b.address
        assert s.memcpy_dtoh(src, 32 * MiB) == data
        assert s.memcpy_dtoh(buf, 8 * MiB) == s.memcpy_dtoh(g.last, 8 * MiB)
