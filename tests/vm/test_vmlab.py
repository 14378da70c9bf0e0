"""The VM lab's console follower (tests/vm/vmlab.py), without a VM: a guest whose kernel
crashed fails its wait at once and says why (it once waited out 240 s for an exit line a
crashed guest never prints), and one that reports its line is waited for."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.vm.vmlab import Guest, GuestCrashed

OOPS = """CRANE-VM-READY
tick 0 sum=1
[   28.486307] BUG: unable to handle page fault for address: 000000069e49006a
[   28.507193] Oops: 0010 [#1] PREEMPT SMP NOPTI
"""


def test_a_crashed_guest_kernel_fails_the_wait_at_once(tmp_path: Path) -> None:
    log = tmp_path / "g.serial"
    log.write_text(OOPS)
    g = Guest("g", log)
    t0 = time.monotonic()
    with pytest.raises(GuestCrashed, match=r"kernel crashed .*BUG: unable to handle page fault"):
        g.wait_for("CRANE-VM-EXIT", timeout=60)
    assert time.monotonic() - t0 < 10
    g._stop.set()


def test_a_line_that_comes_ends_the_wait(tmp_path: Path) -> None:
    log = tmp_path / "g.serial"
    log.write_text("CRANE-VM-READY\ntick 0 BUG: not the kernel's\n")
    g = Guest("g", log)
    with log.open("a") as f:
        f.write("CRANE-VM-EXIT rc=0\n")
    g.wait_for("CRANE-VM-EXIT rc=0", timeout=30)
    with pytest.raises(TimeoutError):
        g.wait_for("never printed", timeout=0.5)
    g._stop.set()
