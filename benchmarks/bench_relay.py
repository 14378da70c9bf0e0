"""The relay's hop vs the worker's own endpoint vs bare gRPC, per kind of socket, in one run.

    python benchmarks/bench_relay.py [--json benchmarks/results/relay.json] [--quick]

For each kind of socket a guest reaches craned by (unix; TCP loopback without TLS, under
``insecure_tcp``; TCP loopback with mutual TLS) one daemon with ``worker_tcp_ports`` serves two
sessions: one relayed through the daemon's process (``direct=False``) and one on its worker's
own endpoint (the unix socket, or the worker's TCP port). The floor is a bare gRPC-Python bidi
ping-pong on the same kind of socket: bench_core's Echo (16-byte messages) against a separate
process serving only the Diagnostics service a worker serves, with the same TLS files. The metric is
the round trip of ``cuStreamSynchronize`` on an idle stream (64-byte-class messages), blocks of
each of the three interleaved with their order rotated, medians, ratios to the bare ping-pong
measured in the same blocks. Target (issue 17): relay path <= 1.15x bare; what the worker's
endpoint reaches is the best the relay could be made to reach by removing its hop. Then
64 MiB copies each way on the relayed session and on the endpoint's (best of 3, alternated).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_core import Bare

from crane.craned.launcher import DaemonProcess
from crane.guest import transport
from crane.guest.session import GuestSession
from crane.wire.channel import TlsFiles


def serve_echo(target: str, cert: str, key: str, ca: str) -> None:
    """The bare floor's server, in a process of its own as a worker is: the Diagnostics
    service a worker serves (its Echo streams raw bytes back), and nothing else."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Event

    from crane.host.diagnostics import DiagnosticsServicer, diagnostics_handler

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((diagnostics_handler(DiagnosticsServicer()),))
    if cert:
        creds = grpc.ssl_server_credentials(
            [(Path(key).read_bytes(), Path(cert).read_bytes())],
            root_certificates=Path(ca).read_bytes(),
            require_client_auth=True,
        )
        port = server.add_secure_port(target, creds)
    else:
        port = server.add_insecure_port(target)
    server.start()
    print(port, flush=True)
    Event().wait()


class Hop:
    """benchmarks/splice_hop.py in a process of its own, listening on ``listen`` (a unix
    socket path) and splicing every connection to ``upstream``."""

    def __init__(self, listen: str, upstream: str) -> None:
        hop = Path(__file__).with_name("splice_hop.py")
        self.listen = listen
        self.proc = subprocess.Popen(
            [sys.executable, str(hop), listen, upstream], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


class BareEcho(Bare):
    """bench_core's bare ping-pong against :func:`serve_echo` in a child process (through a
    splice :class:`Hop` at ``hop``, a unix path, when given)."""

    def __init__(self, target: str, tls: TlsFiles | None, hop: str = "") -> None:
        files = tls or TlsFiles()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-echo", target, files.cert, files.key, files.ca],
            stdout=subprocess.PIPE,
            text=True,
        )
        port = int(self.proc.stdout.readline())  # type: ignore[union-attr]
        self.hop = None
        if hop:
            self.hop = Hop(hop, target[len("unix:") :])
            address = "unix://" + hop
        elif target.startswith("unix:"):
            address = "unix://" + target[len("unix:") :]
        else:
            address = f"tcp://{target.rsplit(':', 1)[0]}:{port}"
        super().__init__(address, files)
        grpc.channel_ready_future(self.ch).result(timeout=10)

    def close(self) -> None:
        self.ch.close()
        if self.hop is not None:
            self.hop.close()
        self.proc.kill()
        self.proc.wait()


def spliced_session(address: str, hop_path: str) -> tuple[GuestSession, Hop]:
    """A session whose calls reach its worker's socket through a splice :class:`Hop` (what a
    daemon splicing a VM's connection would add): the guest is pointed at the hop, which
    forwards to the socket the daemon offered."""
    hops: list[Hop] = []
    real = transport.worker_target

    def via_hop(daemon: str, offered: str) -> str:
        target = real(daemon, offered)
        hops.append(Hop(hop_path, target[len("unix:") :]))
        return "unix:" + hop_path

    transport.worker_target = via_hop
    try:
        s = GuestSession(address, client="bench_relay", direct=True)
    finally:
        transport.worker_target = real
    return s, hops[0]


def sync_times(s: GuestSession, stream: int, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        s.stream_synchronize(stream)
        times.append(time.perf_counter() - t)
    return times


def measure(bares: dict[str, Bare], sessions: dict[str, GuestSession], n: int, blocks: int) -> dict:
    """Every bare ping-pong and every session's sync round trip, in blocks whose order
    rotates; medians in µs and ratios to ``bare``."""
    streams = {k: s.stream_create() for k, s in sessions.items()}
    names = [*bares, *sessions]
    samples: dict[str, list[float]] = {k: [] for k in names}

    def one(name: str, count: int) -> list[float]:
        if name in bares:
            return bares[name].ping_pong(count)
        return sync_times(sessions[name], streams[name], count)

    for name in names:
        one(name, 50)  # warm up
    for b in range(blocks):
        k = b % len(names)
        for name in names[k:] + names[:k]:
            samples[name] += one(name, n)
    med = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    out: dict = {f"{k}_us": v for k, v in med.items()}
    out.update({f"{k}_ratio": v / med["bare"] for k, v in med.items() if k != "bare"})
    out["samples_each"] = n * blocks
    return out


def bandwidth(sessions: dict[str, GuestSession], size: int, reps: int) -> dict[str, float]:
    """Host-to-device and device-to-host GB/s of each session (best of ``reps``, alternated):
    a relayed session's bytes cross the daemon's process, an endpoint's do not."""
    import numpy as np

    data = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    out = np.empty_like(data)
    best: dict[str, float] = {}
    ptrs = {k: s.mem_alloc(size) for k, s in sessions.items()}
    for _ in range(reps):
        for k, s in sessions.items():
            t = time.perf_counter()
            s.memcpy_htod(ptrs[k], data)
            s.synchronize()
            up = time.perf_counter() - t
            t = time.perf_counter()
            s.memcpy_dtoh(ptrs[k], out=out)
            down = time.perf_counter() - t
            best[f"{k}_htod_GBps"] = max(best.get(f"{k}_htod_GBps", 0.0), size / up / 1e9)
            best[f"{k}_dtoh_GBps"] = max(best.get(f"{k}_dtoh_GBps", 0.0), size / down / 1e9)
    for k, s in sessions.items():
        s.mem_free(ptrs[k])
    return best


def run(quick: bool) -> dict:
    import trustme

    n, blocks = (100, 3) if quick else (300, 10)
    # the gRPC paths are what this measures: a unix guest on the daemon's host would otherwise
    # take the call ring (bench_ring.py measures that)
    os.environ["CRANE_RING"] = "0"
    results: dict = {"device": "sim:h100-80gb", "metric": "idle cuStreamSynchronize, us"}
    with tempfile.TemporaryDirectory(prefix="crane-bench-relay-") as tmp_s:
        tmp = Path(tmp_s)
        ca = trustme.CA()
        ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
        files = {}
        for cn in ("craned", "bench"):
            c = ca.issue_cert(cn, "127.0.0.1", common_name=cn)
            c.cert_chain_pems[0].write_to_path(str(tmp / f"{cn}.pem"))
            c.private_key_pem.write_to_path(str(tmp / f"{cn}.key"))
            files[cn] = TlsFiles(
                str(tmp / f"{cn}.pem"), str(tmp / f"{cn}.key"), str(tmp / "ca.pem")
            )
        d_tls = files["craned"]
        tls_args = ["--tls-cert", d_tls.cert, "--tls-key", d_tls.key, "--client-ca", d_tls.ca]
        tcp = ["tcp://127.0.0.1:0"]
        kinds = (
            ("unix", ["--insecure-tcp"], None, f"unix:{tmp}/echo.sock", "47300-47309"),
            ("tcp", ["--insecure-tcp"], TlsFiles(), "127.0.0.1:0", "47310-47319"),
            ("tcp_mtls", tls_args, files["bench"], "127.0.0.1:0", "47320-47329"),
        )
        for kind, args, tls, echo_target, ports in kinds:
            with (
                DaemonProcess(
                    tmp / kind,
                    ["sim:h100-80gb"],
                    extra_listen=tcp,
                    extra_args=[*args, "--worker-tcp-ports", ports],
                ) as d,
                contextlib.ExitStack() as stack,
            ):
                address = d.address if kind == "unix" else d.tcp_address()
                bares: dict[str, Bare] = {"bare": BareEcho(echo_target, tls)}
                stack.callback(bares["bare"].close)
                sessions = {
                    "relay": GuestSession(address, client="bench_relay", direct=False, tls=tls),
                    "worker": GuestSession(address, client="bench_relay", direct=True, tls=tls),
                }
                if kind == "unix":  # a VM's path: the relay vs a splice hop in the daemon
                    echo2 = f"unix:{tmp}/echo2.sock"
                    bares["bare_spliced"] = BareEcho(echo2, None, hop=f"{tmp}/hop-echo.sock")
                    stack.callback(bares["bare_spliced"].close)
                    s, hop = spliced_session(address, f"{tmp}/hop-worker.sock")
                    sessions["worker_spliced"] = s
                    stack.callback(hop.close)
                for s in sessions.values():
                    stack.enter_context(s)
                assert sessions["relay"]._t.path == "relay"
                assert sessions["worker"]._t.path == "direct"
                results[kind] = measure(bares, sessions, n, blocks)
                pair = {k: sessions[k] for k in ("relay", "worker")}
                results[kind] |= bandwidth(pair, (16 if quick else 64) << 20, 3)
    return results


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-echo":
        serve_echo(*sys.argv[2:6])
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="benchmarks/results/relay.json")
    ap.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    args = ap.parse_args()
    results = run(args.quick)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    for kind in ("unix", "tcp", "tcp_mtls"):
        r = results[kind]
        cells = [
            f"{k[:-3]} {v:6.1f} us" + (f" ({r[k[:-3] + '_ratio']:.2f}x)" if k != "bare_us" else "")
            for k, v in r.items()
            if k.endswith("_us")
        ]
        print(f"{kind:9s} " + "  ".join(cells))
        gbps = [f"{k[:-5]} {v:.2f}" for k, v in r.items() if k.endswith("_GBps")]
        print(f"{'':9s} GB/s: " + "  ".join(gbps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
