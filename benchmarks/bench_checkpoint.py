"""Checkpoint and restore throughput vs raw file write/read of the same bytes, in one run.

    python benchmarks/bench_checkpoint.py [--json benchmarks/results/checkpoint.json] [--quick]

For each session size (64 MiB .. 1 GiB of device memory filled with float32 noise, which zstd
barely compresses: the honest case), a session on one craned (sim:h100-80gb) is checkpointed to a
file (Control.Checkpoint, release=False: quiesce, read device memory, compress, checksum, write,
fsync) and restored on a second craned (sim:a100-80gb: a fresh worker, modules reloaded, memory
written back). The baselines write the same number of bytes to a file in the same 8 MiB pieces
with fsync, and read that file back, on the same disk in the same run. Target: ratio >= 0.5.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crane.cli.control_client import ControlClient
from crane.daemon.launcher import DaemonProcess
from crane.guest.session import Session

MiB = 1 << 20
PIECE = 8 * MiB


def raw_write(path: Path, block: bytes, size: int) -> float:
    t = time.perf_counter()
    with open(path, "wb", buffering=1 << 20) as f:
        for off in range(0, size, PIECE):
            f.write(block[off % len(block) : off % len(block) + PIECE])
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t


def raw_read(path: Path) -> float:
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(PIECE)
        while f.readinto(buf):
            pass
    return time.perf_counter() - t


def drop_cache(path: Path) -> None:
    """Evict a file from the page cache so both reads start cold (best effort)."""
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def measure(a: DaemonProcess, b: DaemonProcess, size: int, block: bytes, work: Path) -> dict:
    ckpt = work / f"s{size}.ckpt"
    raw = work / f"s{size}.raw"
    with Session(a.address, client="bench") as s:
        addr = s.mem_alloc(size)
        for off in range(0, size, len(block)):
            s.memcpy_htod(addr + off, block[: min(len(block), size - off)])
        s.synchronize()
        with ControlClient(a.address, timeout=None) as c:
            t = time.perf_counter()
            r = c.checkpoint(s.session_id, str(ckpt), release=False)
            t_ckpt = time.perf_counter() - t
    t_raw_w = raw_write(raw, block, size)
    drop_cache(ckpt)
    drop_cache(raw)
    with ControlClient(b.address, timeout=None) as c:
        t = time.perf_counter()
        c.restore(str(ckpt))
        t_restore = time.perf_counter() - t
    t_raw_r = raw_read(raw)
    ckpt.unlink()
    raw.unlink()
    ckpt_bps, raw_w_bps = size / t_ckpt, size / t_raw_w
    rest_bps, raw_r_bps = size / t_restore, size / t_raw_r
    return {
        "session_bytes": size,
        "file_bytes": r.bytes,
        "checkpoint_s": round(t_ckpt, 3),
        "checkpoint_MBps": round(ckpt_bps / 1e6, 1),
        "raw_write_MBps": round(raw_w_bps / 1e6, 1),
        "checkpoint_ratio": round(ckpt_bps / raw_w_bps, 3),
        "restore_s": round(t_restore, 3),
        "restore_MBps": round(rest_bps / 1e6, 1),
        "raw_read_MBps": round(raw_r_bps / 1e6, 1),
        "restore_ratio": round(rest_bps / raw_r_bps, 3),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default=str(Path(__file__).parent / "results" / "checkpoint.json"))
    p.add_argument("--quick", action="store_true", help="64 MiB only")
    args = p.parse_args()
    sizes = [64 * MiB] if args.quick else [64 * MiB, 256 * MiB, 1024 * MiB]
    block = np.random.default_rng(1).standard_normal(16 * MiB).astype(np.float32).tobytes()
    results = []
    with tempfile.TemporaryDirectory(prefix="crane-bench-ckpt-", dir=os.environ.get("TMPDIR")) as d:
        work = Path(d)
        a = DaemonProcess(work / "a", ["sim:h100-80gb"])
        b = DaemonProcess(work / "b", ["sim:a100-80gb"])
        try:
            for size in sizes:
                m = measure(a, b, size, block, work)
                results.append(m)
                print(json.dumps(m))
                # the restored session on b holds the window; close it by restarting nothing:
                # sessions are independent, b has room for 48
        finally:
            a.stop()
            b.stop()
    out = {
        "benchmark": "checkpoint",
        "data": "float32 standard-normal noise (zstd level 1 barely compresses it)",
        "target_ratio": 0.5,
        "cpus": os.cpu_count(),
        "results": results,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
