"""Load: 16 concurrent guests x 10,000 calls each against one daemon, half on the direct path
and half through the relay, a mix of asynchronous calls (memsets, uploads, device copies, kernel
launches, event records) and synchronizing ones (downloads checked against the expected values,
stream and event synchronization). Every result must be right; afterwards no session worker may
be left (processes and ``<run_dir>/workers``), the device ledger must be zero and the daemon's
resident memory back within 20% of what it was after a warm-up."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from crane.cli.control_client import ControlClient
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from tests.integration.procs import recorded_workers, worker_processes

GUESTS = 16
CALLS = 10_000
N = 256  # ints per buffer

SRC = r"""
extern "C" __global__ void axpb(const int *x, int *y, int a, int b, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
"""


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def guest(address: str, image: bytes, index: int, calls: int, errors: list[str]) -> int:
    """One guest's loop; returns the calls it made. Each round is 10 calls, 3 synchronizing."""
    made = 0
    try:
        with GuestSession(address, client=f"load-{index}", direct=index % 2 == 0) as s:
            fn = s.module_get_function(s.module_load(image), "axpb")
            stream, done = s.stream_create(), s.event_create()
            x, y, z = (s.mem_alloc(N * 4) for _ in range(3))
            rng = np.random.default_rng(index)
            made += 8
            r = 0
            while made < calls:
                host = rng.integers(-1000, 1000, N).astype(np.int32)
                a, b = int(rng.integers(-9, 9)), int(rng.integers(-9, 9))
                s.memset_d32(y, 0xFFFFFFFF, N, stream=stream)  # async
                s.memcpy_htod(x, host, stream=stream)  # async
                s.launch(fn, grid=(N // 128,), block=(128,), params=[x, y, a, b, N],
                         stream=stream)  # fmt: skip
                s.memcpy_dtod(z, y, N * 4, stream=stream)  # async
                s.memset_d8(x, r & 0xFF, 16, stream=stream)  # async
                s.event_record(done, stream)  # async
                s.event_synchronize(done)  # sync
                got = np.frombuffer(s.memcpy_dtoh(z, N * 4, stream=stream), np.int32)  # sync
                head = s.memcpy_dtoh(x, 16, stream=stream)  # sync
                s.stream_query(stream)  # sync
                made += 10
                if not np.array_equal(got, host * a + b) or head != bytes([r & 0xFF]) * 16:
                    errors.append(f"guest {index} round {r}: wrong result")
                    return made
                r += 1
    except Exception as e:
        errors.append(f"guest {index}: {e!r}")
    return made


def test_sixteen_guests_ten_thousand_calls_each(cuda_build, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    image = cuda_build(
        SRC, "-fatbin", "-gencode", "arch=compute_80,code=compute_80", suffix=".fatbin"
    ).read_bytes()
    d = DaemonProcess(tmp_path / "run", ["sim:h100-80gb"])
    try:
        # warm-up: both paths, so the daemon's gRPC and relay buffers exist before the baseline
        errors: list[str] = []
        for i in range(2):
            guest(d.address, image, i, 200, errors)
        assert not errors, errors
        time.sleep(1.0)
        baseline = rss_kib(d.proc.pid)

        made = [0] * GUESTS

        def run(i: int) -> None:
            made[i] = guest(d.address, image, i, CALLS, errors)

        t0 = time.monotonic()
        threads = [threading.Thread(target=run, args=(i,)) for i in range(GUESTS)]
        for t in threads:
            t.start()
        peak = baseline
        while any(t.is_alive() for t in threads):
            peak = max(peak, rss_kib(d.proc.pid))
            time.sleep(0.2)
        took = time.monotonic() - t0
        assert not errors, errors[:5]
        assert all(m >= CALLS for m in made), made

        with ControlClient(d.address) as c:
            deadline = time.monotonic() + 30
            while c.sessions().sessions and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not list(c.sessions().sessions)
            assert all(dev.used_mem == 0 for dev in c.devices().devices)
        left = recorded_workers(d.run_dir)
        served = [p for p in left if f"worker pid {p}" in d.log_text()]
        assert len(left) <= 1, f"workers left: {left}, of which served a session: {served}"
        assert sorted(worker_processes(d.proc.pid)) == sorted(left)  # none unrecorded
        time.sleep(1.0)
        after = rss_kib(d.proc.pid)
        print(
            f"{GUESTS} guests x {sum(made) // GUESTS} calls in {took:.1f} s; daemon RSS "
            f"baseline {baseline} KiB, peak {peak} KiB, after {after} KiB"
        )
        assert after <= baseline * 1.2, (baseline, peak, after)
    finally:
        d.stop()
    assert not recorded_workers(d.run_dir)
    assert not worker_processes(d.proc.pid)
