"""The GPU suite's own logic, on the CPU: environment cleaning, the probe's verdicts, nvcc flag
choice, output and tolerance comparison, and the benchmark's arithmetic and table."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.gpu.harness import (
    GUEST_LIB_DIR,
    PROBE,
    ROOT,
    Run,
    Target,
    arch_flags,
    close_mismatches,
    find_target,
    output_mismatch,
    parse_gpu_archs,
    parse_probe,
    ptx_only_flags,
    suite_backend,
    system_env,
    unsupported_lines,
)


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_system_env_keeps_crane_library_out_and_the_rest_in() -> None:
    lib = str(GUEST_LIB_DIR / "libcuda.so.1")
    env = system_env(
        {
            "LD_PRELOAD": f"{lib} /opt/other.so:/x/crane/interposer/_lib/libcuda.so.1",
            "LD_LIBRARY_PATH": f"{GUEST_LIB_DIR}:/usr/local/cuda/lib64::/opt/lib",
            "CRANE_DAEMON": "unix:///x",
            "CRANE_DAEMON_ALTERNATES": "unix:///y",
            "CRANE_TRACE": "1",
            "PATH": "/usr/bin",
            "CRANE_GPU_SUITE_BACKEND": "cuda:0",
        }
    )
    assert env["LD_PRELOAD"] == "/opt/other.so"
    assert env["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64:/opt/lib"
    assert env["PATH"] == "/usr/bin"
    assert env["CRANE_GPU_SUITE_BACKEND"] == "cuda:0"  # the suite's own setting stays
    assert not {"CRANE_DAEMON", "CRANE_DAEMON_ALTERNATES", "CRANE_TRACE"} & set(env)
    only = system_env({"LD_PRELOAD": lib, "LD_LIBRARY_PATH": str(GUEST_LIB_DIR)})
    assert "LD_PRELOAD" not in only and "LD_LIBRARY_PATH" not in only


def test_probe_output_becomes_a_target_or_a_reason() -> None:
    ok = {
        "count": 1,
        "name": "NVIDIA H100 80GB HBM3",
        "cc": [9, 0],
        "total_mem": 85520809984,
        "driver": 13000,
        "libcuda": "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04",
    }
    t = parse_probe("noise\n" + json.dumps(ok), "cuda:0")
    assert isinstance(t, Target)
    assert (t.name, t.cc, t.driver, t.ordinal, t.simulated) == (
        "NVIDIA H100 80GB HBM3",
        (9, 0),
        "13.0",
        0,
        False,
    )
    err = parse_probe(json.dumps({"error": "cuInit failed: CUDA_ERROR_NO_DEVICE"}), "cuda:0")
    assert isinstance(err, str) and "CUDA_ERROR_NO_DEVICE" in err
    mine = dict(ok, libcuda=str(GUEST_LIB_DIR / "libcuda.so.1"))
    assert "Crane's own" in parse_probe(json.dumps(mine), "cuda:0")  # type: ignore[operator]
    assert "nothing usable" in parse_probe("Traceback ...", "cuda:0")  # type: ignore[operator]


def test_backend_choice_and_the_reasons_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert suite_backend({}) == "cuda:0"
    assert suite_backend({"CRANE_GPU_SUITE_BACKEND": "sim:l4"}) == "sim:l4"
    sim = find_target("sim:h100-80gb")
    assert isinstance(sim, Target) and sim.simulated and sim.cc == (9, 0)
    assert "use cuda" in find_target("rocm:0")  # type: ignore[operator]
    monkeypatch.setattr("tests.gpu.harness.device_nodes", lambda: [])
    reason = find_target("cuda:0")
    assert isinstance(reason, str) and "/dev/nvidia0" in reason


def test_the_probe_uses_the_system_driver_never_crane_library(
    guest_lib: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Crane's libcuda.so.1 on the loader's path would answer the probe (and report no GPU, or
    the daemon's): the probe notices it, and the environment it runs in keeps it out."""
    pytest.importorskip("cuda.bindings")
    crane_first = dict(os.environ, LD_LIBRARY_PATH=str(GUEST_LIB_DIR), CRANE_DAEMON="unix:///no")
    p = subprocess.run(
        [sys.executable, "-c", PROBE, "0"], env=crane_first, capture_output=True, text=True
    )
    assert "Crane's own libcuda.so.1" in parse_probe(p.stdout, "cuda:0")  # type: ignore[operator]
    monkeypatch.setenv("LD_LIBRARY_PATH", str(GUEST_LIB_DIR))
    monkeypatch.setenv("LD_PRELOAD", str(guest_lib))
    p = subprocess.run(
        [sys.executable, "-c", PROBE, "0"], env=system_env(), capture_output=True, text=True
    )
    verdict = parse_probe(p.stdout, "cuda:0")
    assert isinstance(verdict, Target) or "Crane's own" not in verdict, verdict


def test_arch_flags_use_the_device_code_or_the_newest_older_ptx() -> None:
    archs = parse_gpu_archs("compute_75 compute_80 compute_86 compute_90 compute_100 compute_120\n")
    assert archs == [75, 80, 86, 90, 100, 120]
    assert arch_flags((9, 0), archs) == ["-gencode", "arch=compute_90,code=[sm_90,compute_90]"]
    assert arch_flags((10, 0), archs) == ["-gencode", "arch=compute_100,code=[sm_100,compute_100]"]
    # a device newer than nvcc knows (or a minor revision it lacks): PTX, JIT-compiled
    assert arch_flags((8, 9), archs) == ptx_only_flags(86)
    assert arch_flags((12, 1), archs) == ["-gencode", "arch=compute_120,code=compute_120"]
    with pytest.raises(ValueError):
        arch_flags((7, 0), archs)


def _run(code: int, out: str, err: str = "") -> Run:
    return Run(["prog"], code, out, err, 0.1)


def test_output_comparison_reports_what_differs() -> None:
    assert output_mismatch(_run(0, "a\nb\n"), _run(0, "a\nb\n", "crane: noise")) is None
    diff = output_mismatch(
        _run(0, "sum=1\nok\n"),
        _run(1, "sum=2\nok\n", "crane: cuFoo is not supported by Crane\n"),
    )
    assert diff is not None
    assert "exit status: native 0, Crane 1" in diff
    assert "-sum=1" in diff and "+sum=2" in diff
    assert "cuFoo is not supported" in diff
    assert "native" in (output_mismatch(_run(0, "x\n"), _run(0, "x")) or "")  # bytes count
    assert unsupported_lines("a\ncrane: X is NOT SUPPORTED\nb") == ["crane: X is NOT SUPPORTED"]


def test_tolerance_comparison() -> None:
    a = np.array([1.0, 2.0, np.nan, 0.0], dtype=np.float32)
    assert close_mismatches(a, a.copy(), 1e-4, 0.0) is None
    b = a.copy()
    b[1] = 2.001
    msg = close_mismatches(a, b, 1e-4, 0.0)
    assert msg is not None and "1 of 4" in msg and "(1,)" in msg
    assert close_mismatches(a, b, 1e-3, 0.0) is None
    c = a.copy()
    c[2] = 1.0  # a NaN must stay a NaN
    assert close_mismatches(a, c, 1, 1) is not None
    assert "shape" in (close_mismatches(a, a[:2], 1e-4, 0) or "")


def test_bench_parsing_ratios_and_table() -> None:
    b = _bench()
    out = 'warm-up\n{"sms": 132, "compute_s": 1.0, "launch_total_s": 0.04, "launches": 20000}\n'
    data = b.parse_program_output(out)
    assert data["launch_us"] == pytest.approx(2.0)
    runs = [{"compute_s": 1.2, "h2d_pinned_gbs": 20.0}, {"compute_s": 1.1, "h2d_pinned_gbs": 25.0}]
    assert b.best_of(runs, "compute_s", False) == 1.1
    assert b.best_of(runs, "h2d_pinned_gbs", True) == 25.0
    assert b.best_of(runs, "missing", True) is None
    assert b.ratio(1.02, 1.0) == pytest.approx(1.02)
    assert b.ratio(None, 1.0) is None and b.ratio(1.0, 0) is None
    assert b.fmt_ratio(1.02, False) == "**1.020x** (+2.0% time)"
    assert b.fmt_ratio(0.5, True) == "**0.500x** (+100.0% time)"
    results = {
        "device": {"name": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "cc": "90"},
        "backend": "cuda:0",
        "date": "2026-11-21 10:00 UTC",
        "rows": [
            {
                "label": "compute-bound kernel loop",
                "unit": "s",
                "native": 1.0,
                "crane": 1.02,
                "ratio": 1.02,
                "target": 1.03,
            },
            {
                "label": "cudaMemcpy H2D, pinned",
                "unit": "GB/s",
                "native": 25.0,
                "crane": None,
                "ratio": None,
                "higher_is_better": True,
            },
        ],
        "migrate": [
            {
                "session_bytes": 4 << 30,
                "write_set_bytes": 8 << 20,
                "mode": "precopy",
                "rounds": 3,
                "downtime_ms": 41.0,
                "guest_stall_ms": None,
                "total_s": 9.5,
                "raw_copy_s": 2.1,
                "total_vs_raw": 4.52,
            }
        ],
        "notes": ["torch: skipped"],
    }
    md = b.markdown(results)
    assert md.startswith("### NVIDIA H100 80GB HBM3 (driver 580.159.04, sm_90")
    assert (
        "| compute-bound kernel loop | 1 s | 1.02 s | **1.020x** (+2.0% time) | <= 1.03x ✓ |" in md
    )
    assert "| cudaMemcpy H2D, pinned | 25.0 GB/s | - | - |  |" in md
    assert "| 4 GiB | 8 MiB | precopy | 3 | 41.0 ms | - | 9.5 s | 2.1 s | 4.52x |" in md
    assert md.rstrip().endswith("* torch: skipped")


def test_bench_without_a_gpu_measures_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    b = _bench()
    monkeypatch.setattr(b, "find_target", lambda backend: "no NVIDIA GPU visible")
    out = tmp_path / "gpu.json"
    assert b.main(["--json", str(out)]) == 0
    assert "nothing measured: no NVIDIA GPU visible" in capsys.readouterr().out
    assert not out.exists()


def test_torch_script_is_importable_python() -> None:
    src = (ROOT / "tests" / "gpu" / "scripts" / "torch_workload.py").read_text()
    compile(src, "torch_workload.py", "exec")
    assert sys.version_info >= (3, 11)


def test_suite_programs_compile(nvcc: str, tmp_path: Path) -> None:
    """The suite's own CUDA sources (and the benchmark's) build for an H100 with this nvcc."""
    from concurrent.futures import ThreadPoolExecutor

    bench_src = tmp_path / "bench_gpu.cu"
    bench_src.write_text(_bench().PROGRAM)
    sources = [*sorted((ROOT / "tests" / "gpu" / "programs").glob("*.cu")), bench_src]
    flags = arch_flags((9, 0), [80, 90])

    def build(src: Path) -> subprocess.CompletedProcess[str]:
        out = tmp_path / src.stem
        return subprocess.run(
            [nvcc, *flags, "-o", str(out), str(src)], capture_output=True, text=True
        )

    with ThreadPoolExecutor(len(sources)) as pool:
        for src, r in zip(sources, pool.map(build, sources), strict=True):
            assert r.returncode == 0, f"{src.name}: {r.stderr[-2000:]}"
