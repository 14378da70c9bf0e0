"""Device-side calls under crane run on the simulated GPU: virtual functions of objects that
new created in an earlier launch, a function-pointer table, recursion, device malloc beyond
the default heap (NULL) and delete."""

from __future__ import annotations


def test_virtuals_function_pointers_recursion_and_heap(program, run_guest) -> None:
    exe = program("calls_heap.cu", "-gencode", "arch=compute_80,code=compute_80")
    r = run_guest(exe)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "virtual sync=no error ok=1 h[3]=30 h[4]=14 heap=8388608",
        "calls sync=no error ok=1 h[5]=115 big=0",
    ]


def test_dynamic_parallelism(program_dir, run_guest) -> None:
    exe = program_dir(
        "cdp", "-rdc=true", "-gencode", "arch=compute_80,code=compute_80", "-lcudadevrt"
    )
    r = run_guest(exe)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "fire-and-forget sync=no error ok=1 h[255]=318 errs=0000",
        # the tail launch runs after every fire-and-forget child of the grid
        "tail sum=40704 want=40704",
        # 24 nested grids; the 25th launch is refused with cudaErrorLaunchMaxDepthExceeded
        "nesting levels=24 refused=65023",
        # cudaErrorInvalidConfiguration, kept by peek, cleared by get
        "bad config peek=9 get=9 again=0",
        # CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT 4: the 5th and 6th launch are refused
        # (cudaErrorLaunchPendingCountExceeded) and do not run
        "pending limit=no error sync=no error codes=0,0,0,0,69,69 ran=111100",
        # streams and events device code creates; destroyed twice: cudaErrorInvalidResourceHandle;
        # no cudaStreamNonBlocking / timing events: cudaErrorInvalidValue
        "own streams sync=no error ok=1 codes=0,0,0,0,0,0,400,1001",
    ]


def test_malloc_heap_size_limit(program, run_guest) -> None:
    exe = program("heap_limit.cu", "-gencode", "arch=compute_80,code=compute_80")
    r = run_guest(exe)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "set=no error heap=33554432 sync=no error 24MiB=1 40MiB=0"
