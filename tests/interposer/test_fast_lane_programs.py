"""The fast lane (interposer/src/fastlane.c, crane/interposer/fastlane.py): memsets the guest
library's C queues itself once the Python side taught it their allocation and stream. Every
answer and byte of a program that mixes them with what must go the Python way (a range past an
allocation, a freed buffer, a destroyed stream or event, a capture, a mapped host block, two
threads, event records (``cuEventRecordWithFlags`` too) and waits between streams,
device-to-device copies) is
the same with the lane on and off (``CRANE_FAST=0``), over the call ring and the gRPC socket,
and the lane did take the loops' calls."""

from __future__ import annotations

import pytest

EXPECTED = [
    "refused past=CUDA_ERROR_INVALID_VALUE freed=CUDA_ERROR_INVALID_VALUE "
    "freed32=CUDA_ERROR_INVALID_VALUE destroyed=CUDA_ERROR_INVALID_HANDLE",
    "capture before=11 after=77",
    "thread0 CUDA_SUCCESS same=1",
    "thread1 CUDA_SUCCESS same=1",
    "events ok=1 record_gone=CUDA_ERROR_INVALID_HANDLE wait_gone=CUDA_ERROR_INVALID_HANDLE "
    "wait_flags=CUDA_ERROR_INVALID_VALUE record_flags=CUDA_ERROR_INVALID_VALUE",
    "copies ok=1 past=CUDA_ERROR_INVALID_VALUE freed=CUDA_ERROR_INVALID_VALUE pinned=1",
    "mapped host=3c dev=5a",
]


@pytest.mark.parametrize("ring", ["1", "0"], ids=["ring", "grpc"])
def test_memsets_give_the_same_answers_and_bytes_with_the_fast_lane_on_and_off(
    program, run_guest, link_flags, ring
) -> None:  # type: ignore[no-untyped-def]
    exe = program("fast_memsets.cpp", *link_flags, "-lpthread", "-ldl")
    on = run_guest(exe, env={"CRANE_RING": ring})
    assert on.returncode == 0, on.stdout + on.stderr
    off = run_guest(exe, env={"CRANE_RING": ring, "CRANE_FAST": "0"})
    assert off.returncode == 0, off.stdout + off.stderr
    lines = on.stdout.splitlines()
    assert lines[0].startswith("loops a=1 b=1 sum="), lines
    assert lines[1:-1] == EXPECTED
    assert lines[-1] == "fast yes", on.stderr
    assert off.stdout.splitlines()[:-1] == lines[:-1]
    assert off.stdout.splitlines()[-1] == "fast no"


@pytest.mark.parametrize("how", ["park-restore", "migrate"])
def test_the_fast_lane_carries_on_across_a_move(program, run_moved, how) -> None:  # type: ignore[no-untyped-def]
    """Calls the lane queued just before the move (not yet synchronized) reach the device, and
    after it the lane keeps taking the program's calls: the session's allocations, streams and
    events keep their addresses and handles on the destination."""
    m = run_moved(program("fast_moved.cu", "-ldl"), how)
    assert m.first.strip() == "before same=1", m.stderr
    assert m.returncode == 0, m.stdout + m.stderr
    assert m.stdout.splitlines() == ["after same=1 error=cudaSuccess", "fast yes"], m.stderr
