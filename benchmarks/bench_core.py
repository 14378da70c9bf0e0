"""Core data-path benchmarks: Crane's call path vs the bare gRPC floor, measured in one run.

    python benchmarks/bench_core.py [--json benchmarks/results/core.json] [--quick]

Everything runs against one craned on the simulated GPU, over unix sockets, once per path: a
session whose call stream goes straight to its worker ("direct", guests on the daemon's host)
and one relayed by the daemon ("relay", VMs and remote guests). Baselines use the
Diagnostics service (crane.v1.Diagnostics) on the socket that carries the session's calls
(the worker's for "direct", the daemon's for "relay"), so a ratio is Crane's own overhead:
batching, the relay (if any), decoding and executing the call.

* ``sync_rtt``: ``cuStreamSynchronize`` of an idle stream vs one Echo ping-pong (median).
  Target: ratio <= 1.15.
* ``async_rate``: 100k one-byte ``cuMemsetD8`` then one synchronize. Target: >= 100k calls/s.
* ``htod_*``/``dtoh_*``: bandwidth at 1 MiB and 256 MiB vs streaming the same bytes one way
  (Drain / Source) in the same 4 MiB messages. Target: ratio >= 0.8.
* ``security``: what identity and quota accounting cost, as the sync round trip and the async
  call rate of sessions on daemons that differ only in them, blocks interleaved. Over TCP (a
  VM, a remote host; relay path): plain TCP (``insecure_tcp``), mutual TLS (certificates made
  for the run with trustme), mutual TLS with the caller's tenant under a memory quota and a
  session limit. Over the unix socket (direct path): no tenants, and the caller's uid a tenant
  under the same quotas (its credential from the ident socket). Target: overhead <= 5%.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.v1 import diag_pb2
from crane.wire.channel import TlsFiles, open_channel
from crane.wire.status import MAX_CHUNK

MiB = 1 << 20


class Bare:
    """Bare gRPC calls on a Diagnostics service (daemon's or a worker's socket)."""

    def __init__(self, address: str, tls: TlsFiles | None = None) -> None:
        self.ch = open_channel(address, tls)
        self.echo = self.ch.stream_stream(
            "/crane.v1.Diagnostics/Echo",
            request_serializer=diag_pb2.Blob.SerializeToString,
            response_deserializer=diag_pb2.Blob.FromString,
        )
        self.drain = self.ch.stream_unary(
            "/crane.v1.Diagnostics/Drain",
            request_serializer=diag_pb2.Blob.SerializeToString,
            response_deserializer=diag_pb2.DrainReply.FromString,
        )
        self.source = self.ch.unary_stream(
            "/crane.v1.Diagnostics/Source",
            request_serializer=diag_pb2.SourceRequest.SerializeToString,
            response_deserializer=diag_pb2.Blob.FromString,
        )

    def ping_pong(self, n: int) -> list[float]:
        q: queue.SimpleQueue = queue.SimpleQueue()
        replies = self.echo(iter(q.get, None))
        msg = diag_pb2.Blob(payload=b"x" * 16)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            q.put(msg)
            next(replies)
            times.append(time.perf_counter() - t)
        q.put(None)
        return times

    def upload(self, data: bytes) -> float:
        def chunks():  # type: ignore[no-untyped-def]
            for off in range(0, len(data), MAX_CHUNK):
                yield diag_pb2.Blob(payload=data[off : off + MAX_CHUNK])

        t = time.perf_counter()
        reply = self.drain(chunks())
        assert reply.bytes >= len(data)  # serialized Blobs: payload plus framing
        return time.perf_counter() - t

    def download(self, size: int) -> float:
        t = time.perf_counter()
        got = 0
        n = (size + MAX_CHUNK - 1) // MAX_CHUNK
        for blob in self.source(diag_pb2.SourceRequest(size=min(size, MAX_CHUNK), count=n)):
            got += len(blob.payload)
        assert got >= size
        return time.perf_counter() - t


def best_of(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    return min(fn() for _ in range(repeat))


def measure_path(s: GuestSession, bare: Bare, quick: bool) -> dict:
    """All metrics for one session (one path: direct or relay), baselines interleaved."""
    results: dict = {}
    n_rtt = 500 if quick else 3000
    n_async = 20_000 if quick else 100_000
    stream = s.stream_create()
    # interleave baseline and Crane so machine noise hits both alike
    base_t, crane_t = [], []
    for _ in range(3):
        base_t += bare.ping_pong(n_rtt // 3)
        for _ in range(n_rtt // 3):
            t = time.perf_counter()
            s.stream_synchronize(stream)
            crane_t.append(time.perf_counter() - t)
    b, c = statistics.median(base_t), statistics.median(crane_t)
    results["sync_rtt"] = {
        "bare_us": b * 1e6,
        "crane_us": c * 1e6,
        "ratio": c / b,
        "target": "<= 1.15",
    }

    p = s.mem_alloc(4096)
    s.synchronize()
    rates = []
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n_async):
            s.memset_d8(p, 1, 1)
        s.synchronize()
        rates.append(n_async / (time.perf_counter() - t))
    results["async_rate"] = {"calls": n_async, "calls_per_s": max(rates), "target": ">= 100000"}

    for size in (MiB, 256 * MiB):
        label = f"{size // MiB}MiB"
        data = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
        raw = data.tobytes()
        dev = s.mem_alloc(size)
        out = np.empty_like(data)
        reps = 3 if size > 64 * MiB else 20

        def htod(dev: int = dev, data: np.ndarray = data) -> float:
            t = time.perf_counter()
            s.memcpy_htod(dev, data)
            s.synchronize()
            return time.perf_counter() - t

        def dtoh(dev: int = dev, out: np.ndarray = out) -> float:
            t = time.perf_counter()
            s.memcpy_dtoh(dev, out=out)
            return time.perf_counter() - t

        bu = best_of(lambda raw=raw: bare.upload(raw), reps)
        cu = best_of(htod, reps)
        bd = best_of(lambda size=size: bare.download(size), reps)
        cd = best_of(dtoh, reps)
        assert np.array_equal(out, data)
        for kind, bt, ct in (("htod", bu, cu), ("dtoh", bd, cd)):
            results[f"{kind}_{label}"] = {
                "bare_GBps": size / bt / 1e9,
                "crane_GBps": size / ct / 1e9,
                "ratio": bt / ct,
                "target": ">= 0.8",
            }
        s.mem_free(dev)
    return results


def sync_and_async(s: GuestSession, n_rtt: int, n_async: int) -> tuple[list[float], float]:
    """``n_rtt`` synchronize round trips (seconds each) and the rate of ``n_async`` memsets."""
    stream = s.stream_create()
    times = []
    for _ in range(n_rtt):
        t = time.perf_counter()
        s.stream_synchronize(stream)
        times.append(time.perf_counter() - t)
    p = s.mem_alloc(4096)
    t = time.perf_counter()
    for _ in range(n_async):
        s.memset_d8(p, 1, 1)
    s.synchronize()
    rate = n_async / (time.perf_counter() - t)
    s.mem_free(p)
    s.stream_destroy(stream)
    return times, rate


def _overheads(samples: dict[str, tuple[list[float], list[float]]], base: str) -> dict:
    """Median round trip and median call rate per configuration, each against ``base``."""
    b_rtt = statistics.median(samples[base][0])
    b_rate = statistics.median(samples[base][1])
    out: dict = {}
    for name, (times, rates) in samples.items():
        rtt, rate = statistics.median(times), statistics.median(rates)
        out[name] = {
            "sync_rtt_us": rtt * 1e6,
            "async_calls_per_s": rate,
            "rtt_overhead": rtt / b_rtt - 1,
            "rate_overhead": b_rate / rate - 1,
            "target": "<= 0.05",
        }
    return out


def _interleaved(sessions: dict[str, GuestSession], quick: bool) -> dict:
    """Blocks of each configuration in turn, the order rotated every block (on two shared
    cores whichever runs second in a block is measurably luckier or unluckier)."""
    n_rtt, n_async, blocks = (300, 5_000, 3) if quick else (500, 20_000, 12)
    samples: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in sessions}
    names = list(sessions)
    for b in range(blocks):
        for name in names[b % len(names) :] + names[: b % len(names)]:
            s = sessions[name]
            times, r = sync_and_async(s, n_rtt, n_async)
            samples[name][0].extend(times)
            samples[name][1].append(r)
    return samples


def measure_security(tmp: Path, quick: bool) -> dict:
    """Identity and quota accounting on vs off, each configuration its own daemon, measured in
    interleaved blocks. Over TCP (relay path): plain TCP, mutual TLS, mutual TLS with the
    caller's tenant under a memory quota and a session limit. Over the unix socket (direct
    path): no tenants, and the caller's uid a tenant under the same quotas."""
    import os

    import trustme

    ca = trustme.CA()
    files: dict[str, str] = {}
    for cn in ("craned", "bench"):
        cert = ca.issue_cert(cn, "127.0.0.1", common_name=cn)
        files[cn] = str(tmp / f"{cn}.pem")
        cert.cert_chain_pems[0].write_to_path(files[cn])
        cert.private_key_pem.write_to_path(files[cn] + ".key")
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    tls_args = ["--tls-cert", files["craned"], "--tls-key", files["craned"] + ".key"]
    tls_args += ["--client-ca", str(tmp / "ca.pem")]
    quota = tmp / "quota.toml"
    quota.write_text(
        "[tenants.bench]\n"
        f"uids = [{os.getuid()}]\ncerts = ['bench']\nmemory = '64GiB'\nmax_sessions = 8\n"
    )
    quota_args = ["--config", str(quota)]
    client = TlsFiles(files["bench"], files["bench"] + ".key", str(tmp / "ca.pem"))
    tcp = ["tcp://127.0.0.1:0"]
    with (
        DaemonProcess(tmp / "plain", extra_listen=tcp, extra_args=["--insecure-tcp"]) as plain,
        DaemonProcess(tmp / "mtls", extra_listen=tcp, extra_args=tls_args) as mtls,
        DaemonProcess(tmp / "quota", extra_listen=tcp, extra_args=tls_args + quota_args) as q,
        GuestSession(plain.tcp_address(), client="bench_sec", tls=TlsFiles()) as sp,
        GuestSession(mtls.tcp_address(), client="bench_sec", tls=client) as sm,
        GuestSession(q.tcp_address(), client="bench_sec", tls=client) as sq,
        GuestSession(plain.address, client="bench_sec", direct=True) as up,
        GuestSession(q.address, client="bench_sec", direct=True) as uq,
    ):
        assert up._t.path == uq._t.path == "direct"
        tcp_samples = _interleaved({"plain": sp, "mtls": sm, "mtls_quota": sq}, quick)
        unix_samples = _interleaved({"no_tenants": up, "quota": uq}, quick)
    return {
        "tcp_relay": _overheads(tcp_samples, "plain"),
        "unix_direct": _overheads(unix_samples, "no_tenants"),
    }


def run(quick: bool) -> dict:
    results: dict = {"device": "sim:h100-80gb", "transport": "unix socket"}
    with (
        tempfile.TemporaryDirectory(prefix="crane-bench-") as tmp,
        DaemonProcess(Path(tmp) / "run") as daemon,
    ):
        for path in ("direct", "relay"):
            with GuestSession(daemon.address, client="bench_core", direct=path == "direct") as s:
                # the baseline runs on the socket that carries this session's calls
                bare = Bare(s._t.opened.direct_address if path == "direct" else daemon.address)
                results[path] = measure_path(s, bare, quick)
                bare.ch.close()
        results["security"] = measure_security(Path(tmp), quick)
    return results


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="benchmarks/results/core.json")
    ap.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    args = ap.parse_args()
    results = run(args.quick)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    rows = [(p, k, v) for p in ("direct", "relay") for k, v in results[p].items()]
    rows += [(p, k, v) for p, configs in results["security"].items() for k, v in configs.items()]
    for path, k, v in rows:
        cells = [
            f"{kk}={vv:.3f}" if isinstance(vv, float) else f"{kk}={vv}" for kk, vv in v.items()
        ]
        print(f"{path:11s} {k:12s} " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
