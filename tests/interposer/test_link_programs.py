"""JIT linking: an ``nvcc -rdc=true`` program built for PTX only (cudart registers a version-2
fatbin wrapper and the driver links its translation units at load), and a driver-API program
that links PTX, object and library inputs with cuLink* and reads the JIT logs back."""

from __future__ import annotations

import pytest

PTX80 = ("-gencode", "arch=compute_80,code=compute_80")


def test_rdc_program_links_translation_units(program_dir, run_guest) -> None:
    exe = program_dir("rdc", "-rdc=true", *PTX80)
    r = run_guest(exe)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "sync=no error h[5]=1198 hits=64 bias=7 ok=1"
    # each translation unit's printf string is its own (module-local $str renamed apart)
    assert sorted(lines[:-1]) == ["main: bias=7", "ops: first call"]


@pytest.fixture
def link_inputs(cuda_build):  # type: ignore[no-untyped-def]
    from tests.interposer.conftest import PROGRAMS

    kernel = (PROGRAMS / "link" / "kernel.cu").read_text()
    lib = (PROGRAMS / "link" / "lib.cu").read_text()
    return [
        cuda_build(kernel, "-rdc=true", *PTX80, "-ptx", suffix=".ptx"),
        cuda_build(lib, "-rdc=true", *PTX80, "-ptx", suffix=".ptx"),
        cuda_build(lib, "-dc", *PTX80, suffix=".o"),
        cuda_build(lib, "-lib", "-rdc=true", *PTX80, suffix=".a"),
        cuda_build(lib, "-cubin", "-rdc=true", "-arch=sm_80", suffix=".cubin"),
    ]


def test_cu_link_inputs_and_logs(program, run_guest, link_flags, link_inputs) -> None:
    exe = program("link_api.cpp", *link_flags)
    r = run_guest(exe, *link_inputs)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    ok = "ok=1 out[39]=117.5 size_ok=1 info_nul=1 info_len_ok=1 wall_ok=1"
    for label in ("ptx-data", "ptx-file", "object", "library"):
        assert f"{label} {ok}" in out, out
        assert f"{label} result=0" in out
    assert "info    : linked 2 PTX module(s)" in out
    assert "info    : 1 kernel(s): apply]" in out
    # the undefined references reach the app through the error log buffer, by name
    undefined = out.split("undefined result=", 1)[1]
    assert undefined.startswith("200 error_nul=1 error_len_ok=1 error=[")
    assert "error   : Undefined reference to '_Z5scalef' in '" in undefined
    assert "error   : Undefined reference to 'gain' in '" in undefined
    duplicate = out.split("duplicate result=", 1)[1]
    assert duplicate.startswith("200 error=[")
    assert "error   : Multiple definition of 'gain' in '" in duplicate
    # SASS: refused with CUDA_ERROR_NO_BINARY_FOR_GPU, the log names what it holds
    assert "cubin result=209 error=[error   : '" in out
    assert "holds SASS for sm_80 (a cubin), which cannot be linked for a sm_90 device" in out
    # a failed JIT: the log is capped at the buffer's 24 bytes, NUL-terminated, size written back
    assert "loadex result=218 used=23 nul=1 error=[error   : PTX line 5" in out
