"""The guest library inside an application's own Python interpreter (torch, CuPy and every
Python program load libcuda.so.1 into a running interpreter): the first driver call must not
hang in cffi's embedded start-up, and exit-time teardown that runs after the interpreter
finalized (cudart's and cuBLASLt's atexit handlers) must not crash the process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HOSTS = Path(__file__).parent / "hosts"


def _run(script: str, *args: str, daemon: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, CRANE_DAEMON=daemon)
    env.pop("CRANE_TRACE", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_first_call_after_a_capsule_lookup_does_not_hang(guest_lib, idaemon) -> None:
    """On Python < 3.12 a failed attribute look-up on a capsule (import torch does one) left
    cffi's start-up spinning forever at the first driver call."""
    script = """
        import ctypes, datetime, sys
        try:
            datetime.datetime_CAPI.no_such_attribute
        except AttributeError:
            pass
        cuda = ctypes.CDLL(sys.argv[1])
        n = ctypes.c_int()
        print(cuda.cuInit(0), cuda.cuDeviceGetCount(ctypes.byref(n)), n.value)
    """
    try:
        r = _run(script, str(guest_lib), daemon=idaemon.address, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the first driver call hung in the embedded interpreter's start-up")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["0", "0", "1"], r.stdout + r.stderr


@pytest.fixture(scope="module")
def teardown_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the exit-time teardown helper")
    out = tmp_path_factory.mktemp("teardown") / "libteardown.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-o", str(out), str(HOSTS / "teardown.c"), "-ldl"],
        check=True,
        capture_output=True,
    )
    return out


def test_teardown_after_the_interpreter_finalized_exits_cleanly(
    guest_lib, idaemon, teardown_lib
) -> None:
    """A C atexit handler releasing the primary context and unloading a library after
    Py_Finalize: the teardown calls succeed without Python, any other call answers
    CUDA_ERROR_DEINITIALIZED (4), and the process exits 0 (it died with SIGSEGV)."""
    script = """
        import ctypes, sys
        cuda = ctypes.CDLL(sys.argv[1])
        helper = ctypes.CDLL(sys.argv[2])
        assert cuda.cuInit(0) == 0
        ctx = ctypes.c_void_p()
        assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
        assert cuda.cuCtxSetCurrent(ctx) == 0
        ptx = b".version 8.0\\n.target sm_80\\n.address_size 64\\n.visible .entry k() { ret; }\\n"
        lib = ctypes.c_void_p()
        assert cuda.cuLibraryLoadData(ctypes.byref(lib), ptx, None, None, 0, None, None, 0) == 0
        helper.crane_test_register(ctypes.c_void_p(cuda._handle), lib)
        print("python done", flush=True)
    """
    r = _run(script, str(guest_lib), str(teardown_lib), daemon=idaemon.address)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert r.stdout.splitlines() == [
        "python done",
        "teardown release=0 unload=0 synchronize=4",
    ], r.stdout + r.stderr
