"""One real craned (simulated H100) for the whole fuzz suite, a well-behaved guest running beside
the fuzzers from start to end, and the invariants checked when the suite is done.

The number of generated cases is ``CRANE_FUZZ_CASES`` (default 10,000) in total, split between
the fuzz tests by :func:`cases`; Hypothesis runs derandomized and without its example database,
so a run is reproducible and a failure is found again by the same command.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from crane.cli.control_client import ControlClient
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from tests.fuzz.harness import Fuzzer
from tests.integration.procs import recorded_workers, worker_processes

#: Every fuzz test's share of CRANE_FUZZ_CASES (they sum to 1).
SHARES = {"ops": 0.637, "raw": 0.2, "images": 0.15, "checkpoints": 0.01, "close": 0.003}

#: The kernel every image is built from, and the bystander's workload: y = a*x + b.
SRC = r"""
__device__ int launches;
extern "C" __global__ void axpb(const int *x, int *y, int a, int b, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
    if (i == 0) atomicAdd(&launches, 1);
}
"""


def total_cases() -> int:
    return int(os.environ.get("CRANE_FUZZ_CASES", "10000"))


def cases(kind: str) -> int:
    """How many examples the ``kind`` fuzz test generates (at least one)."""
    return max(1, round(total_cases() * SHARES[kind]))


def fuzz_settings(kind: str) -> settings:
    return settings(
        max_examples=cases(kind),
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )


@dataclass
class Bystander:
    """A guest doing allocate/copy/launch/check in a loop beside the fuzzers."""

    address: str
    image: bytes
    rounds: int = 0
    session_id: str = ""
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        try:
            with GuestSession(self.address, client="bystander") as s:
                self.session_id = s.session_id
                mod = s.module_load(self.image)
                fn = s.module_get_function(mod, "axpb")
                stream = s.stream_create()
                rng = np.random.default_rng(1)
                while not self.stop.is_set():
                    n = int(rng.integers(1, 4096))
                    a, b = (int(v) for v in rng.integers(-1000, 1000, 2))
                    x = rng.integers(-(1 << 20), 1 << 20, n).astype(np.int32)
                    dx, dy = s.mem_alloc(n * 4), s.mem_alloc(n * 4)
                    s.memcpy_htod(dx, x.tobytes(), stream=stream)
                    s.memset_d32(dy, 0xDEADBEEF, n, stream=stream)
                    blocks = (n + 127) // 128
                    s.launch(
                        fn, grid=(blocks,), block=(128,), params=[dx, dy, a, b, n], stream=stream
                    )
                    got = np.frombuffer(s.memcpy_dtoh(dy, n * 4, stream=stream), np.int32)
                    want = (x.astype(np.int64) * a + b).astype(np.int32)
                    if not np.array_equal(got, want):
                        self.errors.append(f"round {self.rounds}: wrong result")
                    s.mem_free(dx)
                    s.mem_free(dy)
                    self.rounds += 1
                addr, size = mod.globals["launches"]
                count = int.from_bytes(s.memcpy_dtoh(addr, size), "little")
                if count != self.rounds:
                    self.errors.append(f"{count} launches counted, {self.rounds} made")
        except Exception as e:
            self.errors.append(f"round {self.rounds}: {e!r}")


@dataclass
class FuzzEnv:
    daemon: DaemonProcess
    images: dict[str, bytes]
    bystander: Bystander

    def check_daemon(self) -> None:
        """The daemon is alive and answers its control API."""
        assert self.daemon.proc.poll() is None, self.daemon.log_text()[-3000:]
        with ControlClient(self.daemon.address, timeout=30) as c:
            assert c.devices().devices

    def wait_no_sessions(self, timeout: float = 30.0) -> None:
        """Until the daemon lists no session but the bystander's (a closed one leaves as its
        worker is reaped)."""
        deadline = time.monotonic() + timeout
        with ControlClient(self.daemon.address, timeout=30) as c:

            def others() -> list[tuple[str, str]]:
                sessions = c.sessions().sessions
                return [(x.id, x.state) for x in sessions if x.id != self.bystander.session_id]

            while others() and time.monotonic() < deadline:
                time.sleep(0.05)
            left = others()
        assert not left, f"sessions left: {left}"

    def checkpoint_path(self, name: str) -> Path:
        """Where the checkpoint tests write and restore files: inside the daemon's checkpoint
        directory (its default, RUN_DIR/checkpoints), the only place it reads and writes them."""
        return self.daemon.run_dir / "checkpoints" / name


@pytest.fixture(scope="package")
def images(cuda_build) -> dict[str, bytes]:  # type: ignore[no-untyped-def]
    """The kernel as each kind of image nvcc makes: PTX text, fatbin (PTX), compressed fatbin
    (PTX and sm_80 code), cubin (sm_80)."""
    ptx80 = ("-gencode", "arch=compute_80,code=compute_80")
    return {
        "ptx": cuda_build(SRC, "-ptx", "-arch=compute_80", suffix=".ptx").read_bytes(),
        "fatbin": cuda_build(SRC, "-fatbin", *ptx80, suffix=".fatbin").read_bytes(),
        "fatbin-z": cuda_build(
            SRC,
            "-fatbin",
            *ptx80,
            "-gencode",
            "arch=compute_80,code=sm_80",
            "-Xfatbin=-compress-all",
            suffix=".fatbin",
        ).read_bytes(),
        "cubin": cuda_build(SRC, "-cubin", "-arch=sm_80", suffix=".cubin").read_bytes(),
    }


# module scope: tests/fuzz is no package (no __init__.py), where "package" scope lasts the whole
# test session, and the bystander's busy loop took a core from every test after the fuzzers
@pytest.fixture(scope="module")
def fuzz_env(
    tmp_path_factory: pytest.TempPathFactory, images: dict[str, bytes]
) -> Iterator[FuzzEnv]:
    run = tmp_path_factory.mktemp("fuzz") / "run"
    daemon = DaemonProcess(run, ["sim:h100-80gb"])
    bystander = Bystander(daemon.address, images["fatbin"])
    thread = threading.Thread(target=bystander.run, name="bystander", daemon=True)
    thread.start()
    env = FuzzEnv(daemon, images, bystander)
    try:
        yield env
        # ---- the invariants of the whole run -------------------------------------------------
        bystander.stop.set()
        thread.join(60)
        bystander.session_id = ""
        assert not thread.is_alive(), "the bystander guest hung"
        assert not bystander.errors, bystander.errors[:5]
        assert bystander.rounds > 0
        env.check_daemon()
        env.wait_no_sessions()
        with ControlClient(daemon.address, timeout=30) as c:
            assert all(d.used_mem == 0 for d in c.devices().devices), "device ledger not zero"
        # only the idle pre-spawned worker is left
        workers = recorded_workers(run)
        assert len(workers) <= 1, f"workers left: {workers}"
        assert sorted(worker_processes(daemon.proc.pid)) == sorted(workers)
        # nothing was answered by an exception nobody expected (each is logged with its trace)
        text = daemon.log_text()
        assert "Traceback" not in text, text[text.index("Traceback") - 2000 :][:6000]
        print(f"bystander rounds: {bystander.rounds}")
    finally:
        bystander.stop.set()
        daemon.stop()
    assert not recorded_workers(run), "workers outlived the daemon"
    assert not worker_processes(daemon.proc.pid), "workers outlived the daemon"


@pytest.fixture(scope="module")
def fuzzer(fuzz_env: FuzzEnv) -> Iterator[Fuzzer]:
    """A reused fuzz session aimed at a pool of real objects (tests.fuzz.harness)."""
    f = Fuzzer(fuzz_env.daemon.address, fuzz_env.images["ptx"])
    try:
        yield f
    finally:
        f.close()
        print(f"fuzz: {f.cases} cases, {f.resets} pool rebuilds, {f.reopened} sessions")
        print(f"ops succeeded/answered: {f.report()}")
        fuzz_env.check_daemon()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A time limit that grows with CRANE_FUZZ_CASES (the suite's default is 300 s a test; the
    largest share, 64% of 10,000 cases, takes about 50 s on two cores)."""
    limit = max(300, int(total_cases() * 0.1))
    for item in items:
        if "tests/fuzz/" in str(item.fspath):
            item.add_marker(pytest.mark.timeout(limit))
