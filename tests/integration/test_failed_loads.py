"""A module load that fails leaves nothing behind: no device memory charged to the session (or
other sessions would see out-of-memory for the rest of its life) and no image in the daemon's
module cache (a guest could fill the run directory's disk with refused bytes)."""

from __future__ import annotations

import os

import pytest

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.modules.store import ImageStore

HEADER = ".version 7.8\n.target sm_80\n.address_size 64\n"

#: A small variable placed first, then one no device has room for.
HUGE_GLOBAL = HEADER + (
    ".visible .global .align 4 .b8 small[4096];\n"
    ".visible .global .align 4 .b8 g[107374182400];\n"  # 100 GiB
    ".visible .entry k()\n{\n\tret;\n}\n"
)

FITS = HEADER + (".visible .global .align 4 .b32 v = 7;\n.visible .entry k()\n{\n\tret;\n}\n")


def _cache_bytes(daemon: DaemonProcess) -> int:
    return ImageStore(daemon.run_dir / "modules").size()


def test_refused_module_variable_releases_its_memory(daemon: DaemonProcess) -> None:
    with GuestSession(daemon.address) as s:
        free_before, total = s.mem_get_info()
        with pytest.raises(CudaError) as e:
            s.module_load(HUGE_GLOBAL.encode())
        assert e.value.code == CUresult.CUDA_ERROR_OUT_OF_MEMORY
        assert s.mem_get_info() == (free_before, total)
        # another session can still have (almost) the whole device
        with GuestSession(daemon.address) as other:
            big = other.mem_alloc(free_before - (64 << 20))
            other.mem_free(big)
        # and the failed session carries on: a module that fits loads and works
        mod = s.module_load(FITS.encode())
        addr, size = mod.globals["v"]
        assert int.from_bytes(s.memcpy_dtoh(addr, size), "little") == 7


def test_refused_images_are_not_cached(daemon: DaemonProcess) -> None:
    with GuestSession(daemon.address) as s:
        for _ in range(5):
            with pytest.raises(CudaError) as e:
                s.module_load(os.urandom(1 << 20))
            assert e.value.code == CUresult.CUDA_ERROR_INVALID_IMAGE
        with pytest.raises(CudaError):
            s.module_load(HUGE_GLOBAL.encode())
        assert _cache_bytes(daemon) == 0
        s.module_load(FITS.encode())  # one that loads is cached, by its digest
        assert _cache_bytes(daemon) == len(FITS)


def test_oversized_local_is_refused_at_load_with_a_log_line(session: GuestSession, daemon) -> None:  # type: ignore[no-untyped-def]
    text = HEADER + (
        ".visible .entry k()\n{\n\t.reg .b32 %r<2>;\n\t.local .align 4 .b8 big[4294967296];\n"
        "\tmov.u32 %r1, 1;\n\tst.local.u32 [big], %r1;\n\tret;\n}\n"
    )
    with pytest.raises(CudaError) as e:
        session.module_load(text.encode())
    assert e.value.code == CUresult.CUDA_ERROR_INVALID_PTX
    assert "uses too much local data" in daemon.log_text()
    session.synchronize()  # the worker is alive and the session usable


def test_empty_image_is_a_cuda_error(session: GuestSession) -> None:
    with pytest.raises(CudaError) as e:
        session.module_load(b"")
    assert e.value.code == CUresult.CUDA_ERROR_INVALID_IMAGE
    session.synchronize()


def test_load_refused_when_the_device_fills_midway_releases_its_chunks(
    daemon: DaemonProcess,
) -> None:
    """The variable fits the module area but not the device (another session holds most of
    it): the chunks committed before the ledger said no are released again."""
    with GuestSession(daemon.address) as hog, GuestSession(daemon.address) as s:
        free, _ = s.mem_get_info()
        hog.mem_alloc(free - (1 << 30))
        free_before = s.mem_get_info()[0]
        text = HUGE_GLOBAL.replace("107374182400", str(2 << 30))  # 2 GiB: 1 GiB is free
        with pytest.raises(CudaError) as e:
            s.module_load(text.encode())
        assert e.value.code == CUresult.CUDA_ERROR_OUT_OF_MEMORY
        assert s.mem_get_info()[0] == free_before


def test_variables_after_a_failed_load_start_zeroed(session: GuestSession) -> None:
    """The failed load wrote its first variable's initializer before its second was refused;
    the next module's uninitialized variable takes the same place and must read zero."""
    session.module_load(FITS.encode())
    failing = HEADER + (
        ".visible .global .align 4 .u32 init[4] = {1, 2, 3, 4};\n"
        ".visible .global .align 4 .b8 g[107374182400];\n"
        ".visible .entry k()\n{\n\tret;\n}\n"
    )
    with pytest.raises(CudaError):
        session.module_load(failing.encode())
    fresh = session.module_load(
        (
            HEADER + ".visible .global .align 4 .u32 z[4];\n.visible .entry k2()\n{\n\tret;\n}\n"
        ).encode()
    )
    addr, size = fresh.globals["z"]
    assert bytes(session.memcpy_dtoh(addr, size)) == bytes(16)
