"""A driver-API program (linked with -lcuda) loading its kernel from PTX text (JIT) and from a
fatbin file, launching with kernelParams and with the packed ``extra`` buffer."""

from __future__ import annotations

import pytest

EXPECTED = [
    "h[1]=1.50 h[99]=148.50 counter=200 gsize=4",
    "memtype=2 start_ok=1 param1=(8,4) cc_major_ok=1",
    "ok",
]


@pytest.fixture
def kernels(cuda_build):  # type: ignore[no-untyped-def]
    from tests.interposer.conftest import PROGRAMS

    src = (PROGRAMS / "kernels.cu").read_text()
    return {
        "ptx": cuda_build(src, "-ptx", suffix=".ptx"),
        "fatbin": cuda_build(src, "-fatbin", suffix=".fatbin"),
    }


@pytest.mark.parametrize(
    ("mode", "image"), [("ptx", "ptx"), ("fatbin-data", "fatbin"), ("file", "fatbin")]
)
def test_driver_api_module_load(program, run_guest, link_flags, kernels, mode, image) -> None:
    exe = program("driver_api.cpp", *link_flags)
    r = run_guest(exe, mode, kernels[image])
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"mode={mode} {EXPECTED[0]}"
    assert lines[1:] == EXPECTED[1:]
