"""Metrics and profiles against a real craned (issue 16): the Prometheus exporter scraped over
HTTP while a guest session launches kernels and copies, checked against what it did; a
session's profile naming the kernel it spent its time in; ``crane top``; accounting off; and
the control API's authorization on profiles."""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from crane.cli.control_client import ControlClient
from crane.cli.main import main as crane
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from tests.integration.pki import Pki
from tests.integration.test_auth import TENANTS  # tenants a, b (by certificate) and ops

SRC = r"""
extern "C" __global__ void heavy(float *x, int n, int iters)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        for (int k = 0; k < iters; k++) v = v * 0.999f + 0.5f;
        x[i] = v;
    }
}
extern "C" __global__ void light(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
"""
N = 1024
#: No tenants configured: this process's sessions are its uid's.
TENANT = f"uid:{os.getuid()}"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def image(cuda_build) -> bytes:  # type: ignore[no-untyped-def]
    return cuda_build(
        SRC, "-fatbin", "-gencode", "arch=compute_80,code=compute_80", suffix=".fatbin"
    ).read_bytes()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def metered(tmp_path: Path) -> Iterator[tuple[DaemonProcess, str]]:
    """A daemon serving /metrics; (daemon, the metrics URL)."""
    port = free_port()
    # interpreted only: the PTX compiler's one-off compile (50-350 ms, at a kernel's third
    # launch here) counts in that launch's time, and under load it could rank a light kernel
    # above a heavy one in the profiles these tests compare
    d = DaemonProcess(
        tmp_path / "run",
        extra_args=["--metrics-listen", f"127.0.0.1:{port}"],
        env={**os.environ, "CRANE_PTX_JIT": "0"},
    )
    try:
        yield d, f"http://127.0.0.1:{port}/metrics"
    finally:
        d.stop()


def scrape(url: str) -> Samples:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The one sample of ``name`` whose labels include ``labels`` (None: none)."""
    hits = [
        v
        for (n, ls), v in samples.items()
        if n == name and all(dict(ls).get(k) == want for k, want in labels.items())
    ]
    assert len(hits) <= 1, (name, labels, hits)
    return hits[0] if hits else None


def until(url: str, ok: Callable[[Samples], bool], timeout: float = 15.0) -> Samples:
    """Scrape until ``ok`` (the worker publishes about once a second)."""
    deadline = time.monotonic() + timeout
    while True:
        got = scrape(url)
        if ok(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


class Work:
    """Launches and copies, counted as they are made."""

    def __init__(self, s: GuestSession, image: bytes) -> None:
        self.s = s
        mod = s.module_load(image)
        self.heavy = s.module_get_function(mod, "heavy")
        self.light = s.module_get_function(mod, "light")
        self.x = s.mem_alloc(N * 4)
        self.y = s.mem_alloc(N * 4)
        self.launches = self.h2d = self.d2h = self.d2d = 0

    def step(self, heavy: int, light: int, iters: int = 200) -> None:
        s = self.s
        data = np.arange(N, dtype=np.float32).tobytes()
        s.memcpy_htod(self.x, data)
        self.h2d += len(data)
        for _ in range(heavy):
            s.launch(self.heavy, grid=(N // 256,), block=(256,), params=[self.x, N, iters])
        for _ in range(light):
            s.launch(self.light, grid=(N // 256,), block=(256,), params=[self.x, N])
        self.launches += heavy + light
        s.memcpy_dtod(self.y, self.x, N * 2)
        self.d2d += N * 2
        s.memcpy_dtoh(self.y, N * 4)
        self.d2h += N * 4
        s.synchronize()


def check(samples: Samples, sid: str, w: Work) -> None:
    """The session's metrics say what the work did."""
    assert value(samples, "crane_session_kernel_launches_total", session=sid) == w.launches
    for direction, n in (("h2d", w.h2d), ("d2h", w.d2h), ("d2d", w.d2d)):
        got = value(samples, "crane_session_copy_bytes_total", session=sid, direction=direction)
        assert got == n, direction
    calls = value(samples, "crane_session_calls_total", session=sid, op="LAUNCH")
    assert calls == w.launches
    hist = value(samples, "crane_session_call_duration_seconds_count", session=sid, op="LAUNCH")
    inf = value(
        samples, "crane_session_call_duration_seconds_bucket", session=sid, op="LAUNCH", le="+Inf"
    )
    assert hist == inf == w.launches
    busy = value(samples, "crane_session_gpu_busy_seconds_total", session=sid)
    kernel = value(samples, "crane_session_kernel_seconds_total", session=sid)
    assert busy is not None and kernel is not None and 0 < kernel <= busy


@pytest.mark.parametrize("path", ["direct", "relay"])
def test_metrics_scraped_during_a_workload_match_what_it_did(
    metered: tuple[DaemonProcess, str], image: bytes, path: str
) -> None:
    d, url = metered
    with GuestSession(d.address, client="metrics", direct=path == "direct") as s:
        sid = s.session_id
        w = Work(s, image)
        w.step(heavy=2, light=3)

        def settled(x: Samples) -> bool:
            n = value(x, "crane_session_kernel_launches_total", session=sid)
            return n == w.launches and (
                value(x, "crane_session_copy_bytes_total", session=sid, direction="d2h") == w.d2h
            )

        check(until(url, settled), sid, w)  # mid-run
        w.step(heavy=1, light=4)
        got = until(url, settled)
        check(got, sid, w)
        labels = {"gpu": "0", "tenant": TENANT, "domain": ""}
        assert value(got, "crane_session_kernel_launches_total", session=sid, **labels) == 10
        used = value(got, "crane_session_memory_used_bytes", session=sid)
        assert used is not None and used >= 2 * N * 4
        fb = value(got, "DCGM_FI_DEV_FB_USED", gpu="0")
        assert fb is not None and fb * 2**20 >= used
        assert value(got, "DCGM_FI_DEV_FB_FREE", gpu="0") is not None
        assert value(got, "DCGM_FI_DEV_GPU_UTIL", gpu="0") is not None
        # the simulator has no power, temperature or XID: not exported rather than invented
        assert value(got, "DCGM_FI_DEV_POWER_USAGE") is None
        assert value(got, "DCGM_FI_DEV_GPU_TEMP") is None
        running = value(got, "crane_sessions", state="running")
        assert running == 1
        tenant = labels["tenant"]
    # the session ended: its counts stay in its tenant's totals, its own series are gone
    deadline = time.monotonic() + 15
    while True:
        after = scrape(url)
        gone = value(after, "crane_session_memory_used_bytes", session=sid) is None
        if gone or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert gone
    assert value(after, "crane_tenant_kernel_launches_total", tenant=tenant) == 10
    assert value(after, "crane_tenant_copy_bytes_total", tenant=tenant, direction="h2d") == w.h2d
    assert value(after, "crane_tenant_calls_total", tenant=tenant, op="LAUNCH") == 10


def test_checkpoints_are_counted_and_timed(metered: tuple[DaemonProcess, str]) -> None:
    d, url = metered
    with GuestSession(d.address, client="metrics") as s:
        p = s.mem_alloc(1 << 20)
        s.memset_d8(p, 1, 1 << 20)
        s.synchronize()
        with ControlClient(d.address, timeout=60) as c:
            c.checkpoint(s.session_id, "m.ckpt", False)
            with pytest.raises(grpc.RpcError):
                c.checkpoint("nosuchsession", "n.ckpt", False)
        got = scrape(url)
    assert value(got, "crane_checkpoints_total", tenant=TENANT, result="ok") == 1
    assert value(got, "crane_checkpoints_total", result="error") == 1  # no session: no tenant
    assert value(got, "crane_checkpoint_duration_seconds_count", tenant=TENANT) == 1


def wait_profile(c: ControlClient, sid: str, launches: int) -> object:
    deadline = time.monotonic() + 15
    while True:
        (p,) = c.profiles(sid).profiles
        if p.launches == launches or time.monotonic() > deadline:
            return p
        time.sleep(0.2)


def test_profile_names_the_kernel_the_session_spent_its_time_in(
    metered: tuple[DaemonProcess, str], image: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    """Few launches of a long kernel against many of a short one: the long one leads by GPU
    time, each with its launch count and a mean that is its time over its launches."""
    d, _ = metered
    with GuestSession(d.address, client="profile") as s:
        w = Work(s, image)
        w.step(heavy=3, light=12, iters=2000)
        with ControlClient(d.address) as c:
            p = wait_profile(c, s.session_id, 15)
        assert p.accounting and p.launches == 15
        names = [k.name for k in p.kernels]
        assert names == ["heavy", "light"]
        heavy, light = p.kernels
        assert (heavy.launches, light.launches) == (3, 12)
        assert heavy.gpu_seconds > light.gpu_seconds
        assert heavy.mean_seconds == pytest.approx(heavy.gpu_seconds / 3)
        assert 0 < p.kernel_share <= 1 and p.idle_share < 1
        assert p.kernel_share + p.copy_share + p.idle_share == pytest.approx(1.0)
        assert (p.bytes_h2d, p.bytes_d2h, p.bytes_d2d) == (w.h2d, w.d2h, w.d2d)
        assert crane(["profile", s.session_id, "--daemon", d.address]) == 0
        text = capsys.readouterr().out
        rows = [ln.split()[0] for ln in text.splitlines() if ln.startswith(("heavy", "light"))]
        assert rows == ["heavy", "light"] and "15 launches" in text
        assert crane(["profile", s.session_id, "--json", "--daemon", d.address]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["kernels"][0]["name"] == "heavy" and doc["kernels"][0]["launches"] == "3"
        assert crane(["profile", "nosuchsession", "--daemon", d.address]) == 1
        assert "no session nosuchsession" in capsys.readouterr().err


def test_top_once_and_json(
    metered: tuple[DaemonProcess, str],
    image: bytes,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One frame keeps whole session ids even where rich takes stdout for a dumb terminal
    (FORCE_COLOR with TERM=dumb, as CI runners set): it once shrank the table to 80 columns."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TERM", "dumb")
    d, _ = metered
    with GuestSession(d.address, client="top") as s:
        w = Work(s, image)
        w.step(heavy=2, light=1)
        with ControlClient(d.address) as c:
            wait_profile(c, s.session_id, 3)
        assert crane(["top", "--once", "--daemon", d.address]) == 0
        out = capsys.readouterr().out
        assert "devices" in out and "sessions" in out
        assert s.session_id in out and "NVIDIA H100" in out, out
        assert crane(["top", "--json", "--daemon", d.address]) == 0
        doc = json.loads(capsys.readouterr().out)
    (dev,) = doc["devices"]
    assert dev["sessions"] == 1
    (sess,) = doc["sessions"]
    assert sess["session"]["id"] == s.session_id and sess["launches"] == "3"
    (top,) = sess["kernels"]  # top asks for the leading kernel only
    assert top["name"] in ("heavy", "light") and f"{top['name']} (" in out, out


def test_accounting_off(tmp_path: Path, image: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    """``--no-accounting``: no profile and no per-session call metrics (memory still)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    args = ["--metrics-listen", f"127.0.0.1:{port}", "--no-accounting"]
    with DaemonProcess(tmp_path / "run", extra_args=args) as d, GuestSession(d.address) as s:
        Work(s, image).step(heavy=1, light=1)
        time.sleep(1.5)  # a worker with accounting would have published by now
        with ControlClient(d.address) as c:
            (p,) = c.profiles(s.session_id).profiles
        assert not p.accounting and not p.kernels and p.session.id == s.session_id
        got = scrape(url)
        assert value(got, "crane_session_memory_used_bytes", session=s.session_id)
        assert value(got, "crane_session_kernel_launches_total", session=s.session_id) is None
        assert not (Path(tmp_path / "run" / "sessions") / f"{s.session_id}.metrics").exists()
        assert crane(["profile", s.session_id, "--daemon", d.address]) == 0
        assert "no profile" in capsys.readouterr().out


def test_profiles_follow_the_control_apis_authorization(
    tmp_path: Path, pki: Pki, image: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant sees its own sessions' profiles only (another's is answered as absent); an
    operator sees every tenant's."""
    cfg = tmp_path / "craned.toml"
    cfg.write_text(TENANTS)
    extra = [*pki.daemon_args("craned-a"), "--config", str(cfg)]
    with DaemonProcess(tmp_path / "run", extra_listen=["tcp://127.0.0.1:0"], extra_args=extra) as d:
        tcp = d.tcp_address()

        def become(cn: str) -> None:
            for k, v in pki.issue(cn).env().items():
                monkeypatch.setenv(k, v)

        become("alice")
        with GuestSession(tcp, client="alice's") as s:
            Work(s, image).step(heavy=1, light=1)
            with ControlClient(tcp) as c:
                (mine,) = c.profiles().profiles
            become("bob")
            with ControlClient(tcp) as c:
                assert list(c.profiles().profiles) == []
                with pytest.raises(grpc.RpcError) as e:
                    c.profiles(s.session_id)
                assert e.value.code() == grpc.StatusCode.NOT_FOUND
            become("ops")
            with ControlClient(tcp) as c:
                (seen,) = c.profiles().profiles
    assert mine.session.id == seen.session.id == s.session_id
    assert seen.session.tenant == "a"
