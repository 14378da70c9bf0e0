"""A CUDA program run by a tenant with a 1 GiB device-memory limit: module globals, pool
allocations (cudaMallocAsync), managed memory and the driver's VMM all count against it;
each allocation past it fails with the out-of-memory error the program can handle."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from crane.craned.launcher import DaemonProcess

MiB = 1 << 20


@pytest.fixture
def tenant_daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    config = tmp_path / "craned.toml"
    config.write_text(f'[tenants.t]\nuids = [{os.getuid()}]\nmemory = "1GiB"\n')
    with DaemonProcess(
        tmp_path / "run", ["sim:h100-80gb"], extra_args=["--config", str(config)]
    ) as d:
        yield d


def test_every_way_of_committing_memory_counts(
    program, link_flags, guest_lib, tenant_daemon: DaemonProcess
) -> None:  # type: ignore[no-untyped-def]
    exe = program("quota.cu", *link_flags)
    cmd = [sys.executable, "-m", "crane.cli.main", "run", "--daemon", tenant_daemon.address]
    env = {k: v for k, v in os.environ.items() if k != "CRANE_TRACE"}
    r = subprocess.run([*cmd, "--", str(exe)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[:6] == [
        f"view total={1 << 30} used={256 * MiB}",
        "pool past limit=cudaErrorMemoryAllocation",
        "managed past limit=cudaErrorMemoryAllocation",
        "vmm past limit=CUDA_ERROR_OUT_OF_MEMORY",
        "back to start=1",
        "PASSED: 0 failures",
    ], r.stdout
    assert "tenant t: out of memory: limit 1073741824 bytes" in tenant_daemon.log_text()
