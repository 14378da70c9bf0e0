"""Driver-API families real programs use beside launches and copies, through the interposer
against a craned on the simulated GPU: each an nvcc-built program that checks its own results
against what CUDA documents (and, for occupancy, against cudart's own calculator)."""

from __future__ import annotations


def test_profiler_occupancy_limits_stream_and_function_attributes(
    program, run_guest, link_flags
) -> None:
    r = run_guest(program("driver_families.cu", *link_flags))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED: 0 failures" in r.stdout, r.stdout


def test_mapped_pinned_and_managed_memory(program, run_guest) -> None:
    """Zero-copy memory (allocated and registered with DEVICEMAP) and managed memory: kernels
    and the host see each other's writes at synchronization points, one pointer on both
    sides where CUDA promises it; prefetch, advice, range and pointer attributes answer."""
    r = run_guest(program("host_mapped_managed.cu"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED: 0 failures" in r.stdout, r.stdout


def test_memory_pools_and_stream_ordered_allocation(program, run_guest, link_flags) -> None:
    r = run_guest(program("mem_pools.cu", *link_flags))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED: 0 failures" in r.stdout, r.stdout


def test_child_graphs_clones_and_graph_memory_nodes(program, run_guest) -> None:
    r = run_guest(program("graph_more.cu"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED: 0 failures" in r.stdout, r.stdout


def test_conditional_graph_nodes(program, run_guest) -> None:
    """If/else, while and switch nodes driven by cudaGraphSetConditional in a kernel."""
    r = run_guest(program("graph_conditional.cu", "-gencode", "arch=compute_90,code=compute_90"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED: 0 failures" in r.stdout, r.stdout
