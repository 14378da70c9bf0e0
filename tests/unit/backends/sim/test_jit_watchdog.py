"""The PTX compiler's launch watchdog (crane/backends/sim/ptx/jit/watchdog.py): one thread
sets the stop flag of compiled launches past their deadline, in deadline order; a cancelled
launch is never stopped, and cancelled entries do not pile up."""

from __future__ import annotations

import threading
import time

from crane.backends.sim.ptx.jit import watchdog


def test_fires_in_deadline_order_and_not_when_cancelled():
    fired: list[str] = []
    done = threading.Event()
    now = time.monotonic()

    def mark(name: str):
        def f() -> None:
            fired.append(name)
            if name == "last":
                done.set()

        return f

    watchdog.watch(now + 0.15, mark("last"))
    gone = watchdog.watch(now + 0.05, mark("cancelled"))
    watchdog.watch(now + 0.10, mark("second"))
    watchdog.watch(now - 1.0, mark("first"))  # already past: at once
    watchdog.cancel(gone)
    assert done.wait(5.0)
    assert fired == ["first", "second", "last"]


def test_an_earlier_deadline_wakes_the_thread():
    """The thread waits for the earliest deadline; a new, earlier one must not wait behind a
    later one."""
    far = watchdog.watch(time.monotonic() + 60.0, lambda: None)
    hit = threading.Event()
    t0 = time.monotonic()
    watchdog.watch(t0 + 0.05, hit.set)
    assert hit.wait(5.0)
    assert time.monotonic() - t0 < 5.0
    watchdog.cancel(far)


def test_cancelled_entries_do_not_accumulate():
    """Many short launches with long deadlines: the heap stays small."""
    base = watchdog.pending()
    far = time.monotonic() + 3600.0
    for _ in range(10_000):
        watchdog.cancel(watchdog.watch(far, lambda: None))
    assert watchdog.pending() - base <= 200
