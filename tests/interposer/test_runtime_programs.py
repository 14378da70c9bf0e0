"""Unmodified CUDA runtime programs, built by nvcc at test time, run through the interposer
against a craned on the simulated GPU; each is checked by its own output."""

from __future__ import annotations

import pytest

from tests.interposer.conftest import CUDA_LIB64


def test_static_cudart_vector_add(program, run_guest) -> None:
    r = run_guest(program("vadd.cu"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "sync=cudaSuccess sum=1498500.0 c[999]=2997.0"
    assert "not supported" not in r.stderr


def test_shared_cudart_vector_add(program, run_guest) -> None:
    if not (CUDA_LIB64 / "libcudart.so.13").exists():
        pytest.skip("no libcudart.so.13 in /usr/local/cuda/lib64")
    exe = program("vadd.cu", "-cudart", "shared")
    r = run_guest(exe, env={"LD_LIBRARY_PATH": str(CUDA_LIB64)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "sync=cudaSuccess sum=1498500.0 c[999]=2997.0"


def test_streams_events_and_callbacks_in_stream_order(program, run_guest) -> None:
    r = run_guest(program("streams_events.cu"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "h[0]=0 h[255]=510 h[256]=2000 h[511]=2510"
    assert lines[1] == "order=1,2,3 n=3 query=cudaSuccess elapsed=cudaSuccess nonneg"
    assert lines[2] == "done cudaSuccess"


def test_error_semantics(program, run_guest) -> None:
    r = run_guest(program("errors.cu"))
    assert r.returncode == 0, r.stderr
    out = dict(line.split("=", 1) for line in r.stdout.splitlines() if "good" not in line)
    # an invalid configuration fails at the launch; peek keeps it, get clears it
    assert out["peek"] == out["peek2"] == out["last"] == "cudaErrorInvalidValue"
    assert out["last2"] == "cudaSuccess"
    assert "good=cudaSuccess sync=cudaSuccess" in r.stdout
    # a fault is asynchronous: the launch succeeds, the next sync reports it, and it sticks
    assert out["launch"] == "cudaSuccess"
    assert out["sync"] == out["malloc_after"] == out["sync_again"] == "cudaErrorIllegalAddress"


def test_runtime_features(program, run_guest) -> None:
    r = run_guest(program("features.cu"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "order host",
        "order device 7",
        "order after",
        "const y[0]=1.5 y[3]=34.5 back[3]=0.5",
        "smem before_attr=cudaErrorInvalidValue p[0]=255 p[255]=0",
        "2d pitch_ok=1 out[0][0]=0 out[1][2]=71 out[2][4]=142",
        "memset2d out[0][0]=0 out[2][1]=0 out[1][2]=71 out[1][4]=0xffffffff out[2][4]=142",
        "peer can=0 enable=cudaErrorInvalidDevice copy=20,71",
        "async alloc value=0x1010101",
        "attrs dev=2 host=1 unreg=0 devptr_ok=1 pinned_copy=42",
        "occupancy blocks=8 maxthreads=1024 maxdyn=65536",
        "meminfo ok=1",
        "done",
    ]


@pytest.mark.parametrize(
    ("flags", "args"),
    [
        ((), ("own",)),
        ((), ()),
        (("--default-stream", "per-thread"), ()),
    ],
    ids=["stream-per-thread", "legacy-default-stream", "per-thread-default-stream"],
)
def test_host_threads(program, run_guest, flags, args) -> None:
    r = run_guest(program("threads.cu", *flags), *args)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "threads=4 ok=3,3,3,3 err=cudaSuccess"


@pytest.mark.parametrize(
    ("gencode", "ptx", "binary"),
    [
        ("arch=compute_80,code=compute_80", 80, 90),  # PTX JIT-compiled for the sm_90 device
        ("arch=compute_90,code=compute_90", 90, 90),
        # SASS only (sm_90 from compute_80; sm_75): the simulated GPU runs PTX, so the module is
        # refused at load as a driver refuses code it cannot run (the GPU suite covers SASS)
        ("arch=compute_80,code=sm_90", 80, 90),
        ("arch=compute_75,code=sm_75", 75, 75),
    ],
)
def test_function_attributes_name_the_code_the_device_runs(
    program, run_guest, gencode: str, ptx: int, binary: int
) -> None:
    """cuFuncGetAttribute(PTX_VERSION / BINARY_VERSION): what CUB compares with the
    architectures it was built for (it reported the device's 90 for both, so every Thrust/CUB
    program not built for exactly 9.0 failed with "invalid device function")."""
    r = run_guest(program("func_attrs.cu", "-gencode", gencode))
    if "code=sm_" in gencode:  # SASS only: no code the simulated device can run
        assert r.returncode != 0 and "no kernel image" in r.stdout, r.stdout + r.stderr
        return
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == f"no error ptx={ptx} binary={binary}", r.stdout


@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
def test_thrust_and_cub(run_guest, program, arch):
    """Thrust and CUB as shipped with nvcc (sort, sort_by_key, reduce, scan, unique, copy_if,
    radix, segmented radix sort and segmented reduce), checked against the host's answers. They
    failed at load (CUB takes kernel parameters' addresses) and, before that, CUB refused every
    kernel not built for exactly 9.0."""
    r = run_guest(program("thrust_cub.cu", "-gencode", f"arch={arch},code={arch}"), "3000")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED: 0 failures" in r.stdout, r.stdout


@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
def test_clocks_fp8_and_memcpy_async(run_guest, program, arch):
    """clock64() spinning 0.1 s of the device's clock takes about 0.1 s (it counted
    instructions); FP8 conversions match the host's; cuda::memcpy_async through a block
    barrier (cp.async.bulk and mbarrier expect_tx on compute_90)."""
    r = run_guest(program("async_clock.cu", "-std=c++17", "-gencode", f"arch={arch},code={arch}"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "spin cudaSuccess cycles_ok=1 wall_ok=1 timer_ok=1",
        "fp8 cudaSuccess mismatches=0",
        "memcpy_async cudaSuccess mismatches=0",
    ], r.stdout + r.stderr


def test_thread_block_clusters(run_guest, program):
    """Clusters end to end on the simulated H100: __cluster_dims__ and cudaLaunchKernelEx
    launches, cooperative_groups' cluster API over distributed shared memory, the refused
    launches and the cluster occupancy queries, each checked by the program itself."""
    r = run_guest(program("clusters.cu", "-gencode", "arch=compute_90,code=compute_90"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED: 0 failures" in r.stdout, r.stdout + r.stderr
    assert "ring ok" in r.stdout


def test_pinned_host_memory_is_copy_engine_addressable(program, run_guest, link_flags) -> None:
    """Unified addressing: memsets and device-to-device copies may name page-locked host memory
    (XLA memsets pinned buffers so), in stream order; pageable memory stays refused."""
    r = run_guest(program("uva_pinned.cu", *link_flags))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED" in r.stdout


@pytest.mark.parametrize("arch", ["compute_75", "compute_80"])
def test_wmma_tensor_core_gemm(run_guest, program, arch):
    """A cudaTensorCoreGemm-style WMMA GEMM (shared-memory staging, wmma.load/mma/store,
    an epilogue on the fragment) run through the daemon: the module used to fail to load with
    CUDA_ERROR_INVALID_PTX; the result is checked exactly by the program itself."""
    r = run_guest(program("wmma_gemm.cu", "-gencode", f"arch={arch},code={arch}"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED: 0 failures" in r.stdout and "gemm 64x96x128 checked" in r.stdout, r.stdout
