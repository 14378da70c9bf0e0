"""The source's deadline on a migration destination (crane.migrate.deadline.Stall)."""

from __future__ import annotations

import threading
import time

from crane.migrate.deadline import Stall


def test_fires_only_while_waiting_without_progress() -> None:
    fired = threading.Event()
    stall = Stall("tcp://dst:1", 0.4)
    stall.cancel = fired.set
    try:
        stall.step = "sending round 3 (pre-copy)"
        time.sleep(0.8)  # not waiting on the destination: the source's own work is no stall
        assert not fired.is_set()
        with stall.waiting():
            for _ in range(8):  # progress every 0.1 s keeps it alive past the limit
                time.sleep(0.1)
                stall.touch()
            assert not fired.is_set()
            assert fired.wait(2.0)  # then none
        assert stall.reason == (
            "destination tcp://dst:1 unresponsive: no progress for 0.4 s while sending "
            "round 3 (pre-copy)"
        )
    finally:
        stall.close()
