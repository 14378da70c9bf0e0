"""Launch overhead on the simulated GPU: what one small kernel launch costs the worker.

    python benchmarks/bench_launch.py [--json benchmarks/results/launch.json] [--launches N]
                                      [--rounds R]

One craned (sim:h100-80gb), one guest session over the call ring (the Python session API, so the
guest's own cost stays far below the worker's), one PTX module with two kernels: ``empty`` and
``touch`` (each thread adds 1.0 to one float of a 256-element buffer: 1 block of 256 threads).
Per round, N launches of each kernel then a synchronize, timed end to end (the worker runs
them while the guest enqueues the rest): launches per second and microseconds per launch,
medians over the rounds. ``touch``'s buffer is read back and checked after the rounds.
Kernels this small are what libraries launch most (elementwise ops, reductions' last passes,
index fix-ups), so the per-launch cost, not the math, bounds such programs on the simulator.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession

PTX = """
.version 8.0
.target sm_90
.address_size 64

.visible .entry empty()
{
    ret;
}

.visible .entry touch(.param .u64 p)
{
    .reg .b64 %rd<4>;
    .reg .b32 %r<2>;
    .reg .f32 %f<3>;
    ld.param.u64 %rd1, [p];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd2, %rd2, %rd3;
    ld.global.f32 %f1, [%rd2];
    add.f32 %f2, %f1, 0f3F800000;
    st.global.f32 [%rd2], %f2;
    ret;
}
"""


def run(launches: int, rounds: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="crane-bench-launch-") as tmp:
        d = DaemonProcess(Path(tmp) / "run", ["sim:h100-80gb"])
        try:
            s = GuestSession(d.address, client="bench-launch", direct=True)
            mod = s.module_load(PTX.encode())
            empty = s.module_get_function(mod, "empty")
            touch = s.module_get_function(mod, "touch")
            buf = s.mem_alloc(256 * 4)
            s.memset_d32(buf, 0, 256)
            params = struct.pack("<Q", buf)
            for _ in range(50):  # warm: the compiler's policy compiles after a few launches
                s.launch(empty, (1, 1, 1), (1, 1, 1), b"")
                s.launch(touch, (1, 1, 1), (256, 1, 1), params)
            s.synchronize()
            per = {"empty": [], "touch": []}
            for _ in range(rounds):
                for name, fn, block, p in (
                    ("empty", empty, (1, 1, 1), b""),
                    ("touch", touch, (256, 1, 1), params),
                ):
                    t0 = time.perf_counter()
                    for _ in range(launches):
                        s.launch(fn, (1, 1, 1), block, p)
                    s.synchronize()
                    per[name].append((time.perf_counter() - t0) / launches)
            got = struct.unpack("<256f", s.memcpy_dtoh(buf, 256 * 4))
            want = float(50 + rounds * launches)
            if any(v != want for v in got):
                raise SystemExit(f"touch left {set(got)} in its buffer, not {want}")
            path = s._t.path
            s.close()
        finally:
            d.stop()
    out: dict = {"launches_per_round": launches, "rounds": rounds, "transport": path}
    for name, ts in per.items():
        med = statistics.median(ts)
        out[f"{name}_us_per_launch"] = round(med * 1e6, 1)
        out[f"{name}_launches_per_s"] = round(1 / med)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = Path(__file__).resolve().parents[1]
    ap.add_argument("--json", type=Path, default=root / "benchmarks" / "results" / "launch.json")
    ap.add_argument("--launches", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    os.environ.setdefault("CRANE_RING", "1")
    res = run(a.launches, a.rounds)
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
