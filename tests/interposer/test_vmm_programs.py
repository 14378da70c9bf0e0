"""The CUDA virtual memory management API through the interposer, against a craned on the
simulated GPU: an nvcc-built program (driver API + a kernel through the mapping), and cuda-python
reserving its range at a requested address, as the real-GPU backend does with its window."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

MiB = 1 << 20


def test_vmm_program(program, run_guest, link_flags) -> None:
    r = run_guest(program("vmm.cu", *link_flags))
    assert r.returncode == 0, r.stdout + r.stderr
    g = 2 * MiB
    n = 2 * g // 4
    lines = r.stdout.splitlines()
    assert lines[:8] == [
        f"granularity min={g} rec={g}",
        "reserve at_hint=1 other_elsewhere=1",
        f"kernel cudaSuccess flags=3 bad=0 last={((n - 1) % 1000) * 3 + n - 1}",
        "memset 7 7 7 7",
        "range ok=1 memtype=2 prop_ok=1 retain_ok=1",
        "remap bad=0",
        "reserve_unaligned=CUDA_ERROR_INVALID_VALUE",
        "create_unaligned=CUDA_ERROR_INVALID_VALUE",
    ]
    errors = dict(line.split("=", 1) for line in lines[6:] if "=" in line)
    assert errors == {
        "reserve_unaligned": "CUDA_ERROR_INVALID_VALUE",
        "create_unaligned": "CUDA_ERROR_INVALID_VALUE",
        "create_dev1": "CUDA_ERROR_INVALID_DEVICE",
        "granularity_dev1": "CUDA_ERROR_INVALID_DEVICE",
        "map_outside": "CUDA_ERROR_INVALID_VALUE",
        "map_double": "CUDA_ERROR_INVALID_VALUE",
        "map_alias": "CUDA_ERROR_NOT_SUPPORTED",
        "map_unaligned": "CUDA_ERROR_INVALID_VALUE",
        "map_partial": "CUDA_ERROR_NOT_SUPPORTED",
        "access_unmapped": "CUDA_ERROR_INVALID_VALUE",
        "access_dev1": "CUDA_ERROR_INVALID_DEVICE",
        "unmap_partial": "CUDA_ERROR_INVALID_VALUE",
        "free_vmm": "CUDA_ERROR_INVALID_VALUE",
        "address_free_mapped": "CUDA_ERROR_INVALID_VALUE",
        "export": "CUDA_ERROR_NOT_SUPPORTED",
        "teardown freed": "1",
    }
    assert lines[-1] == "done"
    # refusals explain themselves once on stderr
    assert "aliasing" in r.stderr and "IPC" in r.stderr
    assert "internal error" not in r.stderr


_CUDA_PYTHON = textwrap.dedent(
    """
    import numpy as np
    from cuda.bindings import driver as d

    def ck(ret):
        err, *rest = ret if isinstance(ret, tuple) else (ret,)
        assert err == d.CUresult.CUDA_SUCCESS, err
        return rest[0] if len(rest) == 1 else rest

    ck(d.cuInit(0))
    dev = ck(d.cuDeviceGet(0))
    ctx = ck(d.cuDevicePrimaryCtxRetain(dev))
    ck(d.cuCtxSetCurrent(ctx))
    prop = d.CUmemAllocationProp()
    prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    g = int(ck(d.cuMemGetAllocationGranularity(
        prop, d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)))
    probe = int(ck(d.cuMemAlloc(256)))  # device memory lives in the session's window
    want = (probe + (256 << 30)) // g * g
    size = 8 * g
    got = int(ck(d.cuMemAddressReserve(size, g, want, 0)))
    assert got == want, (hex(got), hex(want))
    # the same request again cannot be placed there: another range, and the caller sees it
    other = int(ck(d.cuMemAddressReserve(size, g, want, 0)))
    assert other != want and (other + size <= want or other >= want + size)
    ck(d.cuMemAddressFree(other, size))
    handle = ck(d.cuMemCreate(size, prop, 0))
    ck(d.cuMemMap(got, size, 0, handle, 0))
    desc = d.CUmemAccessDesc()
    desc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = 0
    desc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    ck(d.cuMemSetAccess(got, size, [desc], 1))
    data = np.arange(size // 4, dtype=np.uint32) * 7
    ck(d.cuMemcpyHtoD(got, data.ctypes.data, data.nbytes))
    back = np.zeros_like(data)
    ck(d.cuMemcpyDtoH(back.ctypes.data, got, back.nbytes))
    assert (back == data).all()
    ck(d.cuMemUnmap(got, size))
    ck(d.cuMemRelease(handle))
    ck(d.cuMemAddressFree(got, size))
    ck(d.cuMemFree(probe))
    print("ok", hex(got))
    """
)


def test_cuda_python_reserves_at_the_requested_address(guest_lib: Path, idaemon) -> None:
    pytest.importorskip("cuda.bindings.driver")
    env = dict(os.environ)
    env.pop("CRANE_TRACE", None)
    env["LD_LIBRARY_PATH"] = f"{guest_lib.parent}:{env.get('LD_LIBRARY_PATH', '')}".rstrip(":")
    env["CRANE_DAEMON"] = idaemon.address
    p = subprocess.run(
        [sys.executable, "-c", _CUDA_PYTHON],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("ok 0x"), p.stdout + p.stderr
