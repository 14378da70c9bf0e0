"""Tenants' quotas on a real craned: device memory (every way a session commits it), the
number of sessions, and the kernel time limit.

The tests run as their own user, and the configuration maps that uid to tenant ``t`` (callers
on a unix socket are identified by their peer credentials), so every guest here is ``t``'s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.cli.control_client import ControlClient
from crane.cli.migrate import migrate
from crane.craned.launcher import DaemonProcess
from crane.device.quota import TenantLedger
from crane.guest.session import GuestSession
from crane.guest.vmm import PROP
from tests.integration.stuck import SPIN_PTX

MiB = 1 << 20
GiB = 1 << 30
PROP_DEV0 = PROP.pack(1, 0, 1, 0, 0, 0, 0, 0)  # pinned, device 0
HEADER = ".version 7.8\n.target sm_80\n.address_size 64\n"


def _globals_ptx(nbytes: int) -> bytes:
    var = f".visible .global .align 4 .b8 g[{nbytes}];\n"
    return (HEADER + var + ".visible .entry k()\n{\n\tret;\n}\n").encode()


def _toml(v: object) -> str:
    """A TOML value: repr is one for str (a literal string), int and float."""
    return ("true" if v else "false") if isinstance(v, bool) else repr(v)


def tenant_daemon(
    tmp_path: Path, name: str = "run", top: dict[str, object] | None = None, **limits: object
) -> DaemonProcess:
    """A craned whose caller (this process's uid) is tenant ``t`` with ``limits`` (``top``:
    the configuration's other keys)."""
    lines = [f"{k} = {_toml(v)}" for k, v in (top or {}).items()]
    lines += ["[tenants.t]", f"uids = [{os.getuid()}]"]
    lines += [f"{k} = {_toml(v)}" for k, v in limits.items()]
    config = tmp_path / f"{name}.toml"
    config.write_text("\n".join(lines) + "\n")
    return DaemonProcess(tmp_path / name, ["sim:h100-80gb"], extra_args=["--config", str(config)])


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[DaemonProcess]:
    with tenant_daemon(tmp_path, memory="1GiB") as d:
        yield d


def _tenant_used(daemon: DaemonProcess) -> int:
    """Bytes tenant ``t`` (the only tenant: id 1) holds, as the workers charged them."""
    ledger = TenantLedger(daemon.run_dir / "tenants.ledger")
    try:
        return ledger.tenant_used(1)
    finally:
        ledger.close()


def _settles_at(daemon: DaemonProcess, expected: int, timeout: float = 10.0) -> bool:
    """Whether the tenant's charge reaches ``expected`` (sessions end asynchronously: the
    daemon clears a slot when it has reaped the worker)."""
    deadline = time.monotonic() + timeout
    while _tenant_used(daemon) != expected:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_alloc_past_the_limit_fails_in_that_guest_only(limited: DaemonProcess) -> None:
    with GuestSession(limited.address, client="quota") as s:
        assert s.mem_get_info() == (GiB, GiB)  # the tenant's view of an 80 GB device
        a = s.mem_alloc(600 * MiB)
        data = np.arange(600 * MiB // 4, dtype=np.uint32)
        s.memcpy_htod(a, data)
        with pytest.raises(CudaError) as e:
            s.mem_alloc(600 * MiB)
        assert e.value.code == CUresult.CUDA_ERROR_OUT_OF_MEMORY
        # the allocation it already had is intact and usable
        back = np.frombuffer(s.memcpy_dtoh(a, 600 * MiB), np.uint32)
        assert (back == data).all()
        s.memset_d32(a, 7, 4)
        assert np.frombuffer(s.memcpy_dtoh(a, 16), np.uint32).tolist() == [7] * 4
        free, total = s.mem_get_info()
        assert total == GiB and free == GiB - 600 * MiB
        s.mem_free(a)
        # alloc/free cycles: the charge goes back every time, nothing leaks
        for _ in range(5):
            x = s.mem_alloc(900 * MiB)
            s.mem_free(x)
        s.synchronize()
        assert _tenant_used(limited) == 0
        assert s.mem_get_info() == (GiB, GiB)
    log = limited.log_text()
    assert f"tenant t: out of memory: limit {GiB} bytes, {600 * MiB} in use" in log


def test_limit_covers_the_sessions_of_the_tenant_together(limited: DaemonProcess) -> None:
    with (
        GuestSession(limited.address, client="one") as s1,
        GuestSession(limited.address, client="two") as s2,
    ):
        s1.mem_alloc(700 * MiB)
        assert s2.mem_get_info()[0] == GiB - 700 * MiB
        with pytest.raises(CudaError) as e:
            s2.mem_alloc(400 * MiB)
        assert e.value.code == CUresult.CUDA_ERROR_OUT_OF_MEMORY
        s2.mem_alloc(300 * MiB)
    # both ended: the daemon cleared their slots
    assert _settles_at(limited, 0)


def test_vmm_create_and_map_past_the_limit(limited: DaemonProcess) -> None:
    with GuestSession(limited.address, client="vmm") as s:
        v = s.vmm
        g = 512 * MiB
        base = v.reserve(4 * g)
        h1 = v.create(g, PROP_DEV0)
        v.map(s.primary_context, base, g, 0, h1)
        s.memset_d32(base, 0xABCD, 16)
        # past the tenant's limit: cuMemCreate refuses what the tenant cannot hold
        with pytest.raises(CudaError) as e:
            v.create(2 * g, PROP_DEV0)
        assert e.value.code == CUresult.CUDA_ERROR_OUT_OF_MEMORY
        # a handle promised within the view, then the memory taken meanwhile: cuMemMap refuses
        h2 = v.create(g, PROP_DEV0)
        x = s.mem_alloc(256 * MiB)
        with pytest.raises(CudaError) as e:
            v.map(s.primary_context, base + g, g, 0, h2)
        assert e.value.code == CUresult.CUDA_ERROR_OUT_OF_MEMORY
        s.mem_free(x)
        v.map(s.primary_context, base + g, g, 0, h2)  # fits again
        assert np.frombuffer(s.memcpy_dtoh(base, 64), np.uint32).tolist() == [0xABCD] * 16
        for h, at in ((h1, base), (h2, base + g)):
            v.unmap(at, g)
            v.release(h)
        v.address_free(base, 4 * g)
        s.synchronize()
        assert _tenant_used(limited) == 0


def test_module_globals_count_and_a_failed_load_releases_them(limited: DaemonProcess) -> None:
    with GuestSession(limited.address, client="globals") as s:
        s.mem_alloc(600 * MiB)
        held = _tenant_used(limited)
        with pytest.raises(CudaError) as e:
            s.module_load(_globals_ptx(500 * MiB))
        assert e.value.code == CUresult.CUDA_ERROR_OUT_OF_MEMORY
        assert _tenant_used(limited) == held  # the refused load left nothing charged
        mod = s.module_load(_globals_ptx(300 * MiB))
        assert mod.globals["g"][1] == 300 * MiB
        assert _tenant_used(limited) >= held + 300 * MiB
        free, total = s.mem_get_info()
        assert total == GiB and free <= GiB - 900 * MiB


# A guest of another tenant: another uid, dropped to after the imports (the interpreter lives
# where only root may read), as tests/integration/as_user.py does. It allocates what it is
# asked for, in MiB, and prints each result and its cuMemGetInfo.
_OTHER_GUEST = """
import os, sys
from crane.api.results import CudaError
from crane.guest.session import GuestSession
uid = int(sys.argv[1])
os.setgroups([]); os.setgid(uid); os.setuid(uid)
with GuestSession(os.environ["CRANE_DAEMON"], client="other tenant") as s:
    for mib in map(int, sys.argv[2:]):
        try:
            s.mem_alloc(mib << 20)
            print("ok", *s.mem_get_info())
        except CudaError as e:
            print(e.code.name)
"""
UID_U = 4103
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(os.geteuid() != 0, reason="running a guest as another uid needs root")
def test_another_tenant_is_not_limited_by_this_one(shared_dir: Path) -> None:
    """Tenant t (this uid, 1 GiB) at its limit does not stop tenant u (another uid, 2 GiB of
    its own): u's allocations, its view and its own limit are its own."""
    cfg = shared_dir / "craned.toml"
    cfg.write_text(
        f'[tenants.t]\nuids = [{os.getuid()}]\nmemory = "1GiB"\n'
        f'[tenants.u]\nuids = [{UID_U}]\nmemory = "2GiB"\n'
    )
    args = ["--config", str(cfg)]
    with (
        DaemonProcess(shared_dir / "run", ["sim:h100-80gb"], extra_args=args) as d,
        GuestSession(d.address, client="t") as s,
    ):
        os.chmod(d.run_dir, 0o755)
        s.mem_alloc(GiB)  # all of t's
        with pytest.raises(CudaError) as e:
            s.mem_alloc(64 * MiB)
        assert e.value.code == CUresult.CUDA_ERROR_OUT_OF_MEMORY
        env = {**os.environ, "CRANE_DAEMON": d.address, "PYTHONPATH": str(ROOT)}
        p = subprocess.run(
            [sys.executable, "-c", _OTHER_GUEST, str(UID_U), "1536", "1024"],
            cwd="/",
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr
        assert p.stdout.splitlines() == [
            f"ok {512 * MiB} {2 * GiB}",  # u's own view, whatever t holds
            "CUDA_ERROR_OUT_OF_MEMORY",  # u's own limit
        ]
        assert s.mem_get_info() == (0, GiB)  # t's view did not move either
        assert "tenant u: out of memory: limit 2147483648 bytes, 1610612736 in use" in d.log_text()


def test_max_sessions(tmp_path: Path) -> None:
    with tenant_daemon(tmp_path, max_sessions=2) as d:
        s1 = GuestSession(d.address, client="one")
        s2 = GuestSession(d.address, client="two")
        with pytest.raises(CudaError) as e:
            GuestSession(d.address, client="three")
        assert e.value.code == CUresult.CUDA_ERROR_DEVICE_UNAVAILABLE
        assert "tenant t is at its limit of 2 sessions" in str(e.value)
        s1.close()
        deadline = time.monotonic() + 10  # the daemon reaps the worker, then the slot is free
        while True:
            try:
                s3 = GuestSession(d.address, client="three")
                break
            except CudaError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        s3.close()
        s2.close()


def test_max_sessions_counts_parked_sessions_and_restores(tmp_path: Path) -> None:
    """A parked session holds its tenant's place; a restore onto a daemon where the tenant is
    at its limit is refused by name, and nothing is left behind there."""
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    top: dict[str, object] = {"checkpoint_dir": str(ckpt)}
    with (
        tenant_daemon(tmp_path, "a", top, max_sessions=1, operator=True) as a,
        tenant_daemon(tmp_path, "b", top, max_sessions=1, operator=True) as b,
    ):
        s = GuestSession(a.address, client="parked")
        x = s.mem_alloc(4096)
        s.memset_d32(x, 5, 4)
        s.synchronize()
        path = str(ckpt / "s.ckpt")
        with ControlClient(a.address, timeout=60) as c:
            c.checkpoint(s.session_id, path, release=True)
        with pytest.raises(CudaError) as e:  # the parked session is still t's one session
            GuestSession(a.address, client="second")
        assert "tenant t is at its limit of 1 sessions" in str(e.value)
        other = GuestSession(b.address, client="there")  # t's one session on b
        with ControlClient(b.address, timeout=60) as c, pytest.raises(grpc.RpcError) as r:
            c.restore(path)
        assert r.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "tenant t is at its limit of 1 sessions" in (r.value.details() or "")
        other.close()
        with ControlClient(a.address, timeout=60) as c:
            c.restore(path)  # back where it was parked: its own entry, not a second session
        assert np.frombuffer(s.memcpy_dtoh(x, 16), np.uint32).tolist() == [5] * 4
        s.close()


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "relay"])
def test_a_kernel_past_the_time_limit_fails_with_launch_timeout(
    tmp_path: Path, direct: bool
) -> None:
    with (
        tenant_daemon(tmp_path, kernel_time_limit_s=1.0) as d,
        GuestSession(d.address, client="spin", direct=direct) as s,
    ):
        flag = s.mem_alloc(4)
        s.memset_d32(flag, 0, 1)
        fn = s.module_get_function(s.module_load(SPIN_PTX.encode() + b"\0"), "spin")
        s.synchronize()
        t0 = time.monotonic()
        s.launch(fn, grid=(1,), block=(32,), params=[flag])
        with pytest.raises(CudaError) as e:
            s.synchronize()
        took = time.monotonic() - t0
        assert e.value.code == CUresult.CUDA_ERROR_LAUNCH_TIMEOUT
        assert 1.0 <= took < 3.0
        # sticky for the context, as a display watchdog's; the worker lives on
        with pytest.raises(CudaError) as e:
            s.mem_get_info()
        assert e.value.code == CUresult.CUDA_ERROR_LAUNCH_TIMEOUT
        assert "kernel spin ran past the kernel time limit of 1 s" in d.log_text()


def test_crane_devices_shows_each_tenants_use_against_its_limits(tmp_path: Path) -> None:
    with (
        tenant_daemon(tmp_path, memory="1GiB", max_sessions=3) as d,
        GuestSession(d.address, client="use") as s,
    ):
        s.mem_alloc(600 * MiB)
        with ControlClient(d.address) as c:
            (t,) = c.devices().tenants
        assert (t.name, t.memory_used, t.memory_limit, t.sessions, t.max_sessions) == (
            "t",
            600 * MiB,
            GiB,
            1,
            3,
        )
        cli = [sys.executable, "-m", "crane.cli.main", "--daemon", d.address, "devices"]
        out = subprocess.run(cli, capture_output=True, text=True, timeout=60, check=True).stdout
        lines = out.splitlines()
        at = lines.index(next(line for line in lines if line.startswith("TENANT")))
        assert lines[at + 1].split() == ["t", "600.0", "MiB", "1.0", "GiB", "1", "3"]


def test_max_sessions_refuses_an_incoming_migration(tmp_path: Path) -> None:
    """A destination where the tenant is at its limit refuses the session by name; the session
    carries on at its source."""
    with (
        tenant_daemon(tmp_path, "a", max_sessions=1, operator=True) as a,
        tenant_daemon(tmp_path, "b", max_sessions=1, operator=True) as b,
        GuestSession(a.address, client="mover", alternates=[b.address]) as s,
        GuestSession(b.address, client="there"),
    ):
        x = s.mem_alloc(4096)
        s.memset_d32(x, 9, 4)
        s.synchronize()
        last = migrate(a.address, s.session_id, b.address)[-1]
        assert last.phase == "failed"
        assert "tenant t is at its limit of 1 sessions" in last.error, last
        assert np.frombuffer(s.memcpy_dtoh(x, 16), np.uint32).tolist() == [9] * 4
        assert s._t.address == a.address
