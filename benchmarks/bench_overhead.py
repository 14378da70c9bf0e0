"""What per-session accounting and profiling cost on the call path: metrics on vs off.

    python benchmarks/bench_overhead.py [--json benchmarks/results/overhead.json] [--quick]

Two craned on the simulated GPU, started the same way except that one has accounting off
(``--no-accounting``: no meter in the worker, nothing published) and the other has it on and
serves the Prometheus exporter (scraped once a second during the run, as a Prometheus server
would). Each metric is measured for both ways a guest reaches its worker (direct: the worker's
own socket; relay: through the daemon), in interleaved rounds (on, off, on, off, ...) so that
the machine's noise hits both alike; the result is the median over rounds and the ratio on/off.

* ``sync_rtt``: ``cuStreamSynchronize`` of an idle stream, median per round. Target: on/off
  <= 1.03.
* ``async_rate``: one-byte ``cuMemsetD8`` calls then one synchronize, calls/s per round (the
  memsets are metered work: each counts bytes and copy time). Target: off/on <= 1.03.
* ``launch_rate``: launches of an empty kernel then one synchronize (each launch is metered
  work with its kernel name in the profile window). Reported, same target.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession

KERNEL = r'extern "C" __global__ void empty(int *p) { }'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _image(tmp: Path) -> bytes:
    src = tmp / "empty.cu"
    src.write_text(KERNEL)
    out = tmp / "empty.fatbin"
    subprocess.run(
        ["nvcc", "-fatbin", "-gencode", "arch=compute_80,code=compute_80", "-o", out, src],
        check=True,
    )
    return out.read_bytes()


class Subject:
    """One session and what it runs each round."""

    def __init__(self, s: GuestSession, image: bytes) -> None:
        self.s = s
        self.stream = s.stream_create()
        self.p = s.mem_alloc(4096)
        mod = s.module_load(image)
        self.fn = s.module_get_function(mod, "empty")
        s.synchronize()

    def sync_rtt(self, n: int) -> float:
        s, stream, times = self.s, self.stream, []
        for _ in range(n):
            t = time.perf_counter()
            s.stream_synchronize(stream)
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    def async_rate(self, n: int) -> float:
        s, p = self.s, self.p
        t = time.perf_counter()
        for _ in range(n):
            s.memset_d8(p, 1, 1)
        s.synchronize()
        return n / (time.perf_counter() - t)

    def launch_rate(self, n: int) -> float:
        s, fn, p = self.s, self.fn, self.p
        t = time.perf_counter()
        for _ in range(n):
            s.launch(fn, grid=(1,), block=(1,), params=[p])
        s.synchronize()
        return n / (time.perf_counter() - t)


_SCRAPER = """
import sys, time, urllib.request
while True:
    time.sleep(1.0)
    try:
        urllib.request.urlopen(sys.argv[1], timeout=5).read()
    except OSError:
        pass
"""


def _scraper(port: int) -> subprocess.Popen:
    """A Prometheus stand-in: its own process (not this one's GIL), one scrape a second."""
    url = f"http://127.0.0.1:{port}/metrics"
    return subprocess.Popen([sys.executable, "-c", _SCRAPER, url])


def measure(on: Subject, off: Subject, rounds: int, quick: bool) -> dict:
    n_rtt = 300 if quick else 1000
    n_async = 10_000 if quick else 40_000
    n_launch = 2_000 if quick else 8_000
    res: dict = {}
    for name, fn, n, lower_better in (
        ("sync_rtt", Subject.sync_rtt, n_rtt, True),
        ("async_rate", Subject.async_rate, n_async, False),
        ("launch_rate", Subject.launch_rate, n_launch, False),
    ):
        fn(on, n // 4)  # warm both
        fn(off, n // 4)
        a, b = [], []
        for r in range(rounds):
            first, second = (on, off) if r % 2 == 0 else (off, on)
            x, y = fn(first, n), fn(second, n)
            (a if first is on else b).append(x)
            (b if first is on else a).append(y)
        m_on, m_off = statistics.median(a), statistics.median(b)
        overhead = m_on / m_off if lower_better else m_off / m_on
        unit = "us" if lower_better else "calls_per_s"
        scale = 1e6 if lower_better else 1.0
        res[name] = {
            f"on_{unit}": m_on * scale,
            f"off_{unit}": m_off * scale,
            "overhead": overhead,
            "rounds": rounds,
            "target": "<= 1.03",
        }
        print(f"  {name}: on {m_on * scale:.1f}, off {m_off * scale:.1f}, overhead {overhead:.3f}")
    return res


def run(quick: bool) -> dict:
    rounds = 7 if quick else 15
    results: dict = {}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        image = _image(tmp)
        port = _free_port()
        with (
            DaemonProcess(tmp / "on", extra_args=["--metrics-listen", f"127.0.0.1:{port}"]) as don,
            DaemonProcess(tmp / "off", extra_args=["--no-accounting"]) as doff,
        ):
            scraper = _scraper(port)
            try:
                for path in ("direct", "relay"):
                    print(f"{path}:")
                    direct = path == "direct"
                    with (
                        GuestSession(don.address, client="bench_on", direct=direct) as son,
                        GuestSession(doff.address, client="bench_off", direct=direct) as soff,
                    ):
                        results[path] = measure(
                            Subject(son, image), Subject(soff, image), rounds, quick
                        )
            finally:
                scraper.kill()
                scraper.wait()
    return results


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="benchmarks/results/overhead.json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    results = run(args.quick)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
