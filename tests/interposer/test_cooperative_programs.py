"""Cooperative launches through the interposer: cudaLaunchCooperativeKernel (which cudart 13
sends to cuLaunchCooperativeKernel) and cudaLaunchKernelEx with the cooperative attribute, a
grid that syncs across blocks checked on the host, the co-residency limit at the call, and a
grid sync in a normal launch failing cleanly."""

from __future__ import annotations


def test_cooperative_launch_program(program, run_guest) -> None:
    r = run_guest(program("cooperative.cu"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        # h100-80gb: 132 SMs x 8 blocks of 256 threads (2048 threads per SM)
        "attr coop=1 max_blocks=1056",
        "coop launch=cudaSuccess bad=0 out[0]=19178",
        "ex launch=cudaSuccess bad=0",
        "full launch=cudaSuccess bad=0",
        "too_large launch=cudaErrorCooperativeLaunchTooLarge "
        "last=cudaErrorCooperativeLaunchTooLarge sync=cudaSuccess",
        "normal launch=cudaSuccess sync=cudaErrorLaunchFailure",
    ]
    assert "not supported" not in r.stderr
