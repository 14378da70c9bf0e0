"""Checkpoint and restore throughput vs raw file write/read of the same bytes, in one run.

    python benchmarks/bench_checkpoint.py [--json benchmarks/results/checkpoint.json] [--quick]

For each session size (64 MiB .. 1 GiB of device memory filled with float32 noise, which zstd
barely compresses: the honest case), a session on one craned (sim:a100-80gb) is checkpointed to a
file (Control.Checkpoint, release=False: quiesce, read device memory, compress, checksum, write,
fsync) and restored on a second craned (sim:h100-80gb, which offers every limit the A100 told
its guest: the restore's pre-flight refuses a device offering less; a fresh worker, modules
reloaded, memory written back). The baselines write the same number of bytes to a file in the
same 8 MiB pieces with fsync, and read that file back (page cache dropped for both files), on
the same disk in the same run. Each timed step starts after a pause (:func:`settle`), and runs
alternate whether the baseline or Crane goes first. Target: ratio >= 0.5.

``--repeat N`` measures each size N times and reports the median of each metric (this machine's
disk and CPU are shared, so single runs vary by 2x).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crane.cli.control_client import ControlClient
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.state.checkpoint import read_meta
from crane.v1 import guest_pb2_grpc
from crane.wire.channel import open_channel

MiB = 1 << 20
PIECE = 8 * MiB
SETTLE_S = 2.0


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


def end_restored(address: str, ckpt: Path) -> None:
    """End the restored session on ``address`` as its guest would (a call stream that closes),
    so that its worker and window slot are free for the next run."""
    with open(ckpt, "rb") as f:
        ident = read_meta(f)["session"]
    with open_channel(address) as ch:
        calls = guest_pb2_grpc.GuestStub(ch).Calls(
            iter(()),
            metadata=(
                ("crane-session", ident["id"]),
                ("crane-token-bin", bytes.fromhex(ident["token"])),
            ),
        )
        for _ in calls:
            pass


def settle() -> None:
    """Let what the previous step set off finish before the next timed one: the disk's
    write-back, and a daemon spawning the idle worker that replaces one a session took (a
    second of imports on a CPU the next step needs)."""
    time.sleep(SETTLE_S)


def measure(
    a: DaemonProcess, b: DaemonProcess, size: int, block: bytes, work: Path, baseline_first: bool
) -> dict:
    """One run. ``baseline_first``: time the raw write (read) before the checkpoint (restore),
    else after; runs alternate, so that neither side always finds the disk in the state the
    other left it."""
    ckpt = work / f"s{size}.ckpt"
    raw = work / f"s{size}.raw"
    with GuestSession(a.address, client="bench") as s:
        addr = s.mem_alloc(size)
        for off in range(0, size, len(block)):
            s.memcpy_htod(addr + off, block[: min(len(block), size - off)])
        s.synchronize()
        settle()
        if baseline_first:
            t_raw_w = raw_write(raw, block, size)
            settle()
        with ControlClient(a.address, timeout=None) as c:
            t = time.perf_counter()
            r = c.checkpoint(s.session_id, str(ckpt), release=False)
            t_ckpt = time.perf_counter() - t
        if not baseline_first:
            settle()
            t_raw_w = raw_write(raw, block, size)
    drop_cache(ckpt)
    drop_cache(raw)
    settle()
    if baseline_first:
        t_raw_r = raw_read(raw)
        settle()
    with ControlClient(b.address, timeout=None) as c:
        t = time.perf_counter()
        c.restore(str(ckpt))
        t_restore = time.perf_counter() - t
    if not baseline_first:
        settle()
        t_raw_r = raw_read(raw)
    end_restored(b.address, ckpt)
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


def median_of(runs: list[dict]) -> dict:
    """Each metric's median over the runs (ratios too: the median of per-run ratios)."""
    out = dict(runs[0])
    for k, v in out.items():
        if isinstance(v, float):
            out[k] = round(statistics.median(r[k] for r in runs), 3)
    out["runs"] = len(runs)
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default=str(Path(__file__).parent / "results" / "checkpoint.json"))
    p.add_argument("--quick", action="store_true", help="64 MiB only")
    p.add_argument("--sizes", help="comma-separated MiB, e.g. 64,256 (overrides --quick)")
    p.add_argument("--repeat", type=int, default=1, help="runs per size; medians are reported")
    args = p.parse_args()
    sizes = [64 * MiB] if args.quick else [64 * MiB, 256 * MiB, 1024 * MiB]
    if args.sizes:
        sizes = [int(x) * MiB for x in args.sizes.split(",")]
    block = np.random.default_rng(1).standard_normal(16 * MiB).astype(np.float32).tobytes()
    results = []
    with tempfile.TemporaryDirectory(prefix="crane-bench-ckpt-", dir=os.environ.get("TMPDIR")) as d:
        work = Path(d)
        a = DaemonProcess(work / "a", ["sim:a100-80gb"], checkpoint_dir=work)
        b = DaemonProcess(work / "b", ["sim:h100-80gb"], checkpoint_dir=work)
        try:
            for size in sizes:
                runs = []
                for i in range(max(args.repeat, 1)):
                    runs.append(measure(a, b, size, block, work, baseline_first=i % 2 == 1))
                    print("  run", json.dumps(runs[-1]), file=sys.stderr)
                m = median_of(runs)
                results.append(m)
                print(json.dumps(m))
                # each restore leaves a session on b until its worker's attach timeout: b has
                # room for 48 (sessions are independent)
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
