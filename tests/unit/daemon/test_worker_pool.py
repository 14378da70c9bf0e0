"""The pool of idle workers keeps its size when many sessions open at once (found by the load
test: concurrent opens each started a refill, and each refill added a worker, leaving up to 12
idle worker processes behind for good)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from crane.daemon.workers import WorkerPool
from crane.host.lifeline import PidFiles, alive


def _live(pids: PidFiles) -> set[int]:
    return {int(p.name) for p in pids.folder.iterdir() if p.name.isdigit() and alive(int(p.name))}


def test_concurrent_refills_do_not_overshoot_the_pool(tmp_path: Path) -> None:
    pids = PidFiles(tmp_path / "workers")
    pool = WorkerPool(1, "warning", pids)
    taken = pool.take(replenish=False)  # the pool is empty now
    start = threading.Barrier(8)

    def refill() -> None:
        start.wait()
        pool.refill()  # what each session opened at the same moment starts

    threads = [threading.Thread(target=refill) for _ in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        time.sleep(0.5)
        idle = _live(pids) - {taken.pid}
        assert len(idle) == 1, f"{len(idle)} idle workers for a pool of 1"
    finally:
        pool.close()
        taken.stop()
