"""The built guest library itself: its exports against what cudart 13 asks for, proc-address
resolution, NOT_SUPPORTED stubs, tracing, the integrity digest's MD2, and generated-code drift."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from crane.api.driver_spec import SPEC
from crane.codegen import gen_interposer
from crane.codegen.gen_interposer import variants

REFERENCE = Path(__file__).parent / "cudart13-getprocaddress.txt"


def _exports(lib: Path) -> set[str]:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(lib)], check=True, capture_output=True, text=True
    ).stdout
    return {line.split()[-1] for line in out.splitlines() if " T " in line}


def _lookups() -> list[tuple[str, int, int]]:
    rows = []
    for line in REFERENCE.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        parts = line.split()
        if len(parts) == 3:
            rows.append((parts[0], int(parts[1]), int(parts[2])))
    return rows


def _py(code: str, lib: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ctypes code against the library in a fresh Python (a process that runs Python)."""
    import os

    full = dict(os.environ)
    full.pop("CRANE_TRACE", None)
    full.update(env or {})
    prologue = f"import ctypes\nlib = ctypes.CDLL({str(lib)!r})\n"
    return subprocess.run(
        [sys.executable, "-c", prologue + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full,
        timeout=60,
    )


def test_soname(guest_lib: Path) -> None:
    out = subprocess.run(["readelf", "-d", str(guest_lib)], capture_output=True, text=True).stdout
    assert "Library soname: [libcuda.so.1]" in out


def test_exports_every_symbol_cudart_looks_up(guest_lib: Path) -> None:
    exported = _exports(guest_lib)
    wanted = {name for name, _, _ in _lookups() if name}
    assert len(wanted) > 300
    assert sorted(wanted - exported) == []
    # and every ABI variant the spec's table knows, including the _ptds/_ptsz ones
    assert sorted({v.symbol for v in variants()} - exported) == []
    assert {"cuGetProcAddress_v2", "cuGetExportTable", "cuMemcpyHtoD_v2_ptds"} <= exported


def test_every_cudart_lookup_resolves(guest_lib: Path) -> None:
    rows = [(n, v, f) for n, v, f in _lookups() if n]
    r = _py(
        f"""
        rows = {rows!r}
        gpa = lib.cuGetProcAddress_v2
        gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                        ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
        bad = []
        for name, ver, flags in rows:
            fn, st = ctypes.c_void_p(), ctypes.c_int(-1)
            if gpa(name.encode(), ctypes.byref(fn), ver, flags, ctypes.byref(st)) or not fn.value:
                bad.append((name, ver, flags, st.value))
        fn, st = ctypes.c_void_p(), ctypes.c_int(-1)
        print("probe", gpa(b"", ctypes.byref(fn), 0, 0, ctypes.byref(st)), st.value)
        print("bad", bad)
        """,
        guest_lib,
    )
    assert r.returncode == 0, r.stderr
    assert "probe 500 1" in r.stdout  # "" -> CUDA_ERROR_NOT_FOUND, SYMBOL_NOT_FOUND
    assert "bad []" in r.stdout


@pytest.mark.parametrize(
    ("name", "version", "flags", "symbol"),
    [
        ("cuCtxSynchronize", 2000, 0, "cuCtxSynchronize"),
        ("cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2"),
        ("cuCtxGetDevice", 13000, 0, "cuCtxGetDevice_v2"),
        ("cuEventElapsedTime", 12080, 0, "cuEventElapsedTime_v2"),
        ("cuMemAlloc", 3020, 0, "cuMemAlloc_v2"),
        ("cuMemcpyHtoD", 7000, 2, "cuMemcpyHtoD_v2_ptds"),
        ("cuMemcpyHtoD", 7000, 0, "cuMemcpyHtoD_v2"),
        ("cuLaunchKernel", 7000, 2, "cuLaunchKernel_ptsz"),
        ("cuStreamGetCaptureInfo", 12030, 0, "cuStreamGetCaptureInfo_v3"),
        ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
        ("cuDevicePrimaryCtxRelease", 7000, 0, "cuDevicePrimaryCtxRelease"),
    ],
)
def test_versioned_lookup(
    guest_lib: Path, name: str, version: int, flags: int, symbol: str
) -> None:
    r = _py(
        f"""
        gpa = lib.cuGetProcAddress_v2
        gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                        ctypes.c_uint64, ctypes.c_void_p]
        fn = ctypes.c_void_p()
        rc = gpa({name!r}.encode(), ctypes.byref(fn), {version}, {flags}, None)
        want = ctypes.cast(getattr(lib, {symbol!r}), ctypes.c_void_p).value
        print(rc, fn.value == want)
        """,
        guest_lib,
    )
    assert r.stdout.split() == ["0", "True"], r.stderr


def test_unsupported_returns_not_supported_and_logs_once(guest_lib: Path) -> None:
    r = _py(
        """
        f = lib.cuArrayGetSparseProperties
        print(f(None, None), f(None, None))
        print(lib.cuGraphicsMapResources(0, None, None))
        """,
        guest_lib,
    )
    assert r.stdout.split() == ["801", "801", "801"], r.stderr
    logged = [line for line in r.stderr.splitlines() if "not supported" in line]
    assert len(logged) == 2
    assert "cuArrayGetSparseProperties" in logged[0] and "cuGraphicsMapResources" in logged[1]


def test_md2_and_export_tables(guest_lib: Path) -> None:
    r = _py(
        """
        out = ctypes.create_string_buffer(16)
        for msg in (b"", b"abc", b"message digest"):
            lib.crane_md2(msg, len(msg), out)
            print(out.raw.hex())
        tbl = ctypes.c_void_p()
        unknown = (ctypes.c_ubyte * 16)(*range(16))
        print(lib.cuGetExportTable(ctypes.byref(tbl), unknown))
        hooks = bytes.fromhex("a094798c2e742e7493f20800200c0a66")
        print(lib.cuGetExportTable(ctypes.byref(tbl), hooks),
              ctypes.cast(tbl, ctypes.POINTER(ctypes.c_size_t))[0])
        """,
        guest_lib,
    )
    assert r.stdout.split() == [
        "8350e5a3e24c153df2275c9f80692773",
        "da853b0d3f88d99b30283a69e6ded6bb",
        "ab4f496bfb2a530b219ff33031fe06b0",
        "500",
        "0",
        "56",
    ], r.stderr


def test_context_is_thread_local_and_local_only(guest_lib: Path) -> None:
    """Current context and CLS never touch the session (no daemon is configured here)."""
    r = _py(
        """
        import threading
        c = ctypes.c_void_p()
        lib.cuDevicePrimaryCtxRetain(ctypes.byref(c), 0)
        lib.cuCtxSetCurrent(c)
        seen = []
        def other():
            o = ctypes.c_void_p(1)
            lib.cuCtxGetCurrent(ctypes.byref(o))
            seen.append(o.value)
        t = threading.Thread(target=other); t.start(); t.join()
        mine = ctypes.c_void_p()
        lib.cuCtxGetCurrent(ctypes.byref(mine))
        print(mine.value == c.value, seen)
        """,
        guest_lib,
        env={"CRANE_DAEMON": "unix:///nonexistent/crane.sock"},
    )
    assert r.stdout.split() == ["True", "[None]"], r.stderr


def test_no_daemon_fails_like_no_gpu(guest_lib: Path) -> None:
    r = _py(
        "print(lib.cuInit(0))",
        guest_lib,
        env={"CRANE_DAEMON": "unix:///nonexistent/crane.sock"},
    )
    assert r.stdout.strip() == "100"  # CUDA_ERROR_NO_DEVICE
    assert "cannot open a session" in r.stderr


def test_trace_logs_calls_with_arguments_and_results(program, run_guest) -> None:
    r = run_guest(program("vadd.cu"), env={"CRANE_TRACE": "1"})
    assert r.returncode == 0
    assert "crane-trace: cuMemAlloc_v2(dptr=0x" in r.stderr
    assert "bytesize=4000) = 0" in r.stderr
    launches = [ln for ln in r.stderr.splitlines() if ln.startswith("crane-trace: cuLaunchKernel(")]
    assert len(launches) == 1 and "blockDimX=256" in launches[0] and launches[0].endswith("= 0")


def test_generated_code_is_current() -> None:
    assert gen_interposer.main(["--check"]) == 0


def test_spec_entries_are_unique() -> None:
    keys = [(e.name, e.version) for e in SPEC]
    assert len(keys) == len(set(keys))


def test_guest_and_worker_share_one_sticky_set() -> None:
    from crane.api.results import STICKY
    from crane.engine import dispatch
    from crane.interposer import runtime

    assert runtime.STICKY is STICKY and dispatch.STICKY is STICKY
    assert {int(c) for c in STICKY} >= {700, 710, 716, 719}


def test_every_fast_form_names_its_entrys_parameters_and_a_packed_op() -> None:
    """driver_spec.FAST: each entry is a Python entry whose every ABI variant (``_ptds``,
    ``_ptsz``) gets the fast form too; its arguments are the entry's own parameter names or
    literals; and the wire ops the fast lane queues are packed ops the C queue serves, with
    the arguments in the order the C side writes them (interposer/src/fastlane.c)."""
    from crane.api.driver_spec import FAST, How, spec_key
    from crane.api.ops import OPS_BY_NAME
    from crane.guest.callq import SERVED

    py = {spec_key(e.name, e.version) for e in SPEC if e.how is How.PY}
    entries = (gen_interposer.ROOT / "interposer" / "generated" / "entries.c").read_text()
    for key, fast in FAST.items():
        assert key in py, key
        vs = [v for v in variants() if v.target and spec_key(v.target[0], v.target[1]) == key]
        assert vs, key
        names = {n for _, n in vs[0].params}
        for a in fast.args:
            assert a in names or a == "NULL" or a.isdigit(), (key, a)
        for v in vs:
            body = entries.split(f" {v.symbol}(", 1)[1].split("\n}\n", 1)[0]
            assert f"{fast.fn}(" in body, v.symbol
    # what crane_fast_arm is handed (crane/interposer/fastlane.py), and each op's arguments
    layout = {
        "MEMSET": ["dst", "value", "elem_size", "count", "stream"],
        "EVENT_RECORD": ["event", "stream"],
        "STREAM_WAIT_EVENT": ["stream", "event", "flags"],
        "MEMCPY_DTOD": ["dst", "src", "size", "stream"],
    }
    for name, args in layout.items():
        op = OPS_BY_NAME[name]
        assert op.id in SERVED, name
        assert [p.name for p in op.args] == args, name
