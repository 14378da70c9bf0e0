"""What the GPU suite (tests/gpu) and ``benchmarks/bench_gpu.py`` share: finding the GPU with the
system's driver (never Crane's own ``libcuda.so.1``), choosing nvcc flags for its architecture,
running a program natively and through ``crane run``, and comparing what the two printed.

The logic that needs no GPU is unit-tested on the CPU (tests/gpu/test_harness.py).

``CRANE_GPU_SUITE_BACKEND`` picks the backend under test: ``cuda:0`` (the default) on a GPU host;
``sim:PROFILE`` checks the suite's own plumbing on a CPU-only host, where the "native" side of
each comparison is the same program through a second daemon on the simulator.
"""

from __future__ import annotations

import difflib
import glob
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
GUEST_LIB_DIR = ROOT / "crane" / "interposer" / "_lib"
SUITE_BACKEND_ENV = "CRANE_GPU_SUITE_BACKEND"
DEFAULT_BACKEND = "cuda:0"
#: Environment variables of Crane's guest side that a native run must not see.
_CRANE_ENV_PREFIXES = ("CRANE_DAEMON", "CRANE_TRACE", "CRANE_RESUME")

__all__ = [
    "DEFAULT_BACKEND",
    "GUEST_LIB_DIR",
    "PROBE",
    "ROOT",
    "SUITE_BACKEND_ENV",
    "Run",
    "Target",
    "arch_flags",
    "close_mismatches",
    "crane_argv",
    "device_nodes",
    "find_target",
    "output_mismatch",
    "parse_gpu_archs",
    "parse_probe",
    "ptx_only_flags",
    "run_crane",
    "run_native",
    "suite_backend",
    "system_env",
    "unsupported_lines",
]


def suite_backend(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get(SUITE_BACKEND_ENV, "").strip() or DEFAULT_BACKEND


@dataclass(frozen=True)
class Target:
    """The device under test, as the system driver (or the simulator's profile) describes it."""

    backend: str  # "cuda:N" or "sim:PROFILE"
    name: str
    cc: tuple[int, int]
    total_mem: int
    driver: str = ""  # driver version, "" on the simulator
    libcuda: str = ""  # the libcuda.so.1 the probe loaded

    @property
    def simulated(self) -> bool:
        return self.backend.startswith("sim:")

    @property
    def ordinal(self) -> int:
        _, _, arg = self.backend.partition(":")
        return int(arg) if arg.isdigit() else 0


# --- the environment of a native run ---------------------------------------------------------


def _is_crane_lib(entry: str) -> bool:
    p = entry.rstrip("/")
    if not p:
        return False
    if "crane/interposer/_lib" in p:
        return True
    try:
        real = Path(p).resolve()
    except OSError:
        return False
    return real == GUEST_LIB_DIR or real.parent == GUEST_LIB_DIR


def system_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) without anything that would make a program
    load Crane's ``libcuda.so.1`` instead of the driver's, and without Crane's guest settings."""
    env = dict(os.environ if base is None else base)
    for key in ("LD_PRELOAD", "LD_LIBRARY_PATH"):
        if key in env:
            # ld.so splits LD_PRELOAD on colons and spaces, LD_LIBRARY_PATH on colons
            parts = re.split(r"[: ]+" if key == "LD_PRELOAD" else ":", env[key])
            kept = [p for p in parts if p and not _is_crane_lib(p)]
            if kept:
                env[key] = ":".join(kept)
            else:
                del env[key]
    for key in list(env):
        if key.startswith(_CRANE_ENV_PREFIXES):
            del env[key]
    return env


# --- finding the GPU --------------------------------------------------------------------------

#: Run by a fresh interpreter in :func:`system_env`: cuInit, the device's identity, and which
#: libcuda.so.1 the process mapped (so a probe that got Crane's library says so).
PROBE = r"""
import json, sys
ordinal = int(sys.argv[1])
def libcuda():
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libcuda.so" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return ""
class Failed(Exception):
    pass
def call(what, r):
    r = r if isinstance(r, tuple) else (r,)
    if int(r[0]) != 0:
        raise Failed(f"{what} failed: {getattr(r[0], 'name', int(r[0]))}")
    return r[1] if len(r) == 2 else r[1:]
def probe():
    try:
        from cuda.bindings import driver as d
    except ImportError as e:
        return {"error": f"cuda-python (cuda.bindings) is not importable: {e}"}
    call("cuInit", d.cuInit(0))
    count = call("cuDeviceGetCount", d.cuDeviceGetCount())
    if count <= ordinal:
        return {"error": f"the driver sees {count} GPU(s), no device {ordinal}"}
    dev = call("cuDeviceGet", d.cuDeviceGet(ordinal))
    A = d.CUdevice_attribute
    cc = [call("attr", d.cuDeviceGetAttribute(a, dev)) for a in (
        A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)]
    return {
        "count": count,
        "name": call("cuDeviceGetName", d.cuDeviceGetName(256, dev)).split(b"\0")[0].decode(),
        "cc": cc,
        "total_mem": call("cuDeviceTotalMem", d.cuDeviceTotalMem(dev)),
        "driver": call("cuDriverGetVersion", d.cuDriverGetVersion()),
    }
try:
    out = probe()
except Exception as e:  # a missing driver library, a failing call
    out = {"error": f"{type(e).__name__}: {e}" if not isinstance(e, Failed) else str(e)}
out["libcuda"] = libcuda()
print(json.dumps(out))
"""


def parse_probe(text: str, backend: str) -> Target | str:
    """The probe's output as a :class:`Target`, or the reason the GPU is unusable."""
    lines = [ln for ln in text.strip().splitlines() if ln.startswith("{")]
    if not lines:
        return f"the GPU probe printed nothing usable: {text.strip()[-300:]!r}"
    data = json.loads(lines[-1])
    lib = data.get("libcuda", "")
    if lib and _is_crane_lib(str(Path(lib).parent)):
        return f"the GPU probe loaded Crane's own libcuda.so.1 ({lib}), not the driver's"
    if "error" in data:
        return f"no usable GPU: {data['error']}" + (f" (libcuda: {lib})" if lib else "")
    v = int(data["driver"])
    return Target(
        backend=backend,
        name=data["name"],
        cc=(int(data["cc"][0]), int(data["cc"][1])),
        total_mem=int(data["total_mem"]),
        driver=f"{v // 1000}.{v % 1000 // 10}",
        libcuda=lib,
    )


def device_nodes() -> list[str]:
    return sorted(glob.glob("/dev/nvidia[0-9]*"))


def find_target(backend: str | None = None, python: str = sys.executable) -> Target | str:
    """The device under test, or why there is none (a skip reason)."""
    backend = backend or suite_backend()
    kind, _, arg = backend.partition(":")
    if kind == "sim":
        from crane.backends.sim.profiles import get_profile

        p = get_profile(arg)
        return Target(backend, p.name, tuple(p.compute_capability), p.total_mem)  # type: ignore[arg-type]
    if kind != "cuda":
        return f"{SUITE_BACKEND_ENV}={backend!r}: use cuda[:N] or sim:PROFILE"
    ordinal = int(arg) if arg else 0
    if not device_nodes():
        return (
            "no NVIDIA GPU visible (no /dev/nvidia0); the GPU suite runs on a GPU host "
            f"(scripts/gpu_suite.sh), or on the simulator with {SUITE_BACKEND_ENV}=sim:h100-80gb"
        )
    try:
        p = subprocess.run(
            [python, "-c", PROBE, str(ordinal)],
            env=system_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        return "the GPU probe (cuInit through cuda-python) did not answer in 120 s"
    if p.returncode != 0:
        return f"the GPU probe failed ({p.returncode}): {p.stderr.strip()[-300:]}"
    return parse_probe(p.stdout, f"cuda:{ordinal}")


# --- nvcc flags -------------------------------------------------------------------------------


def parse_gpu_archs(text: str) -> list[int]:
    """``nvcc --list-gpu-arch`` output (compute_75 compute_80 ...) as sorted numbers."""
    return sorted({int(m) for m in re.findall(r"compute_(\d+)", text)})


def arch_flags(cc: tuple[int, int], supported: Sequence[int]) -> list[str]:
    """nvcc flags for a device of compute capability ``cc``: its own machine code plus its PTX
    when nvcc knows the architecture, else PTX of the newest older one (the driver JITs it)."""
    want = cc[0] * 10 + cc[1]
    if want in supported:
        return ["-gencode", f"arch=compute_{want},code=[sm_{want},compute_{want}]"]
    older = [a for a in supported if a <= want]
    if not older:
        raise ValueError(f"nvcc supports none of the architectures up to sm_{want}: {supported}")
    return ptx_only_flags(max(older))


def ptx_only_flags(arch: int) -> list[str]:
    """Embed only PTX for ``compute_<arch>``: loading the module makes the driver JIT it."""
    return ["-gencode", f"arch=compute_{arch},code=compute_{arch}"]


# --- running a program ------------------------------------------------------------------------


@dataclass
class Run:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def describe(self, tail: int = 1500) -> str:
        return (
            f"$ {' '.join(self.argv)}\n-> exit {self.returncode} in {self.seconds:.1f} s\n"
            f"stdout:\n{self.stdout[-tail:]}\nstderr:\n{self.stderr[-tail:]}"
        )


def _run(argv: list[str], env: dict[str, str], timeout: float, cwd: Path | None) -> Run:
    t = time.perf_counter()
    try:
        p = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False
        )
        return Run(argv, p.returncode, p.stdout, p.stderr, time.perf_counter() - t)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
        return Run(argv, -9, out or "", (err or "") + f"\n[timed out after {timeout} s]", timeout)


def run_native(
    argv: Sequence[str | Path],
    env: Mapping[str, str] | None = None,
    timeout: float = 180,
    cwd: Path | None = None,
) -> Run:
    """Run on the system driver: Crane's library kept out of the way."""
    full = system_env()
    full.update(env or {})
    return _run([str(a) for a in argv], full, timeout, cwd)


def crane_argv(address: str, argv: Sequence[str | Path]) -> list[str]:
    return [sys.executable, "-m", "crane.cli.main", "run", "--daemon", address, "--"] + [
        str(a) for a in argv
    ]


def run_crane(
    address: str,
    argv: Sequence[str | Path],
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    cwd: Path | None = None,
) -> Run:
    """Run through ``crane run`` against the daemon at ``address``."""
    full = system_env()
    full.update(env or {})
    return _run(crane_argv(address, argv), full, timeout, cwd)


# --- comparing --------------------------------------------------------------------------------


def unsupported_lines(stderr: str) -> list[str]:
    """Crane's one-line notes about driver functions or features it does not serve."""
    return [ln for ln in stderr.splitlines() if "not supported" in ln.lower()]


def output_mismatch(native: Run, crane: Run, max_diff_lines: int = 60) -> str | None:
    """None when both exited alike and printed the same bytes; else a report for the failure."""
    problems: list[str] = []
    if native.returncode != crane.returncode:
        problems.append(f"exit status: native {native.returncode}, Crane {crane.returncode}")
    if native.stdout != crane.stdout:
        diff = list(
            difflib.unified_diff(
                native.stdout.splitlines(),
                crane.stdout.splitlines(),
                "native",
                "crane",
                lineterm="",
            )
        )
        if not diff:  # same lines, different bytes (line endings, trailing newline)
            diff = [f"native {native.stdout!r}", f"crane  {crane.stdout!r}"]
        if len(diff) > max_diff_lines:
            diff = [*diff[:max_diff_lines], f"... ({len(diff) - max_diff_lines} more lines)"]
        problems.append("stdout differs:\n" + "\n".join(diff))
    if not problems:
        return None
    notes = unsupported_lines(crane.stderr)
    if notes:
        problems.append("Crane said:\n" + "\n".join(notes[:20]))
    problems.append(f"Crane's stderr (end):\n{crane.stderr[-1500:]}")
    if native.stderr.strip():
        problems.append(f"native stderr (end):\n{native.stderr[-800:]}")
    return "\n".join(problems)


def close_mismatches(
    want: np.ndarray, got: np.ndarray, rtol: float, atol: float, show: int = 5
) -> str | None:
    """None when ``got`` equals ``want`` within ``rtol``/``atol`` element-wise (NaNs must sit
    in the same places); else how and where they differ."""
    if want.shape != got.shape:
        return f"shape {got.shape} != {want.shape}"
    w = want.astype(np.float64)
    g = got.astype(np.float64)
    bad = ~np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    if not bad.any():
        return None
    idx = np.argwhere(bad)[:show]
    where = ", ".join(
        f"{tuple(int(x) for x in i)}: {g[tuple(i)]!r} vs {w[tuple(i)]!r}" for i in idx
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.abs(g - w)[bad] / np.maximum(np.abs(w[bad]), atol)
    r = r[np.isfinite(r)]
    rel = float(r.max()) if r.size else float("nan")
    return f"{int(bad.sum())} of {bad.size} elements differ (max rel {rel:.3g}); {where}"
