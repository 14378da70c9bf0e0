"""Unmodified CUDA programs built by nvcc whose calls travel through the shared-memory call
ring (``CRANE_RING=require``: a refused ring is an error, not a silent fallback), with the same
output as over the worker's gRPC socket, across a park/restore and a live migration."""

from __future__ import annotations

import pytest

from crane.wire import ring as wring

pytestmark = pytest.mark.skipif(bool(wring.available()), reason=wring.available() or "")

VADD = "sync=cudaSuccess sum=1498500.0 c[999]=2997.0"


def test_a_runtime_program_runs_over_the_ring_and_the_grpc_socket(
    program, run_guest, idaemon
) -> None:  # type: ignore[no-untyped-def]
    exe = program("vadd.cu")
    before = idaemon.log_text().count("guest attached through the call ring")
    ring = run_guest(exe, env={"CRANE_RING": "require"})
    assert ring.returncode == 0, ring.stderr
    assert ring.stdout.strip() == VADD
    assert idaemon.log_text().count("guest attached through the call ring") == before + 1
    grpc = run_guest(exe, env={"CRANE_RING": "0"})
    assert grpc.returncode == 0, grpc.stderr
    assert grpc.stdout.strip() == VADD
    assert idaemon.log_text().count("guest attached through the call ring") == before + 1


@pytest.mark.parametrize("how", ["park-restore", "migrate"])
def test_a_program_on_the_ring_moves_and_reattaches(program, run_moved, how, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("CRANE_RING", "require")  # on the source and, after the move, on b
    m = run_moved(program("graph_park.cu"), how)
    assert m.first == "before capture=cudaSuccess inst=cudaSuccess sync=cudaSuccess host_calls=3"
    assert m.returncode == 0, m.stderr
    assert m.stdout.splitlines()[0].startswith("after launch=cudaSuccess ok=1 host_calls=7")
    log = m.destination.log_text()
    assert f"session {m.session}" in log and "guest attached through the call ring" in log


def test_large_copies_of_a_program_give_the_same_bytes_on_the_ring_and_the_grpc_socket(
    program, run_guest
) -> None:  # type: ignore[no-untyped-def]
    """cudaMemcpy and cudaMemcpyAsync of 13 MiB, pageable and page-locked, unaligned: over the
    ring the bytes go through its bulk area from and into the program's own buffers."""
    exe = program("bulk_copies.cu")
    ring = run_guest(exe, env={"CRANE_RING": "require"})
    assert ring.returncode == 0, ring.stderr
    ok = "copies=" + ",".join(["cudaSuccess"] * 6) + " same=1,1 bumped=1 sum="
    assert ring.stdout.startswith(ok), ring.stdout
    grpc = run_guest(exe, env={"CRANE_RING": "0"})
    assert grpc.returncode == 0, grpc.stderr
    assert grpc.stdout == ring.stdout
