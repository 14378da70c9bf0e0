"""Stream capture and CUDA graphs through the interposer: runtime programs built by nvcc at
test time, run under ``crane run`` against a craned on the simulated GPU."""

from __future__ import annotations


def test_captured_graph_with_fork_join_replayed(program, run_guest) -> None:
    r = run_guest(program("graph_capture.cu"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "capture begin=cudaSuccess end=cudaSuccess before=0 during=1,1 same_id=1 after=0",
        # upload, add, accum (forked), add on c, sum3 (joined), download, host function
        "graph nodes=7 roots=1",
        # arguments were captured by value (add +1, not +1000); five replays accumulate
        "launches=5 inst=cudaSuccess sync=cudaSuccess ok=1 out[7]=53 host_calls=5",
        "chain a[0]=2450 a[299]=2450 err=cudaSuccess",
    ]
    assert "not supported" not in r.stderr


def test_explicitly_built_graph(program, run_guest) -> None:
    r = run_guest(program("graph_explicit.cu"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "add memset=cudaSuccess kernel=cudaSuccess memcpy=cudaSuccess nodes=5/5 roots=1 type1=0",
        "kernel params grid=4 block=64 a=3 b=1",
        "run1 h[0]=7 h[5]=12 h[199]=206 host_seen=12",
        "run2 set=cudaSuccess h[0]=20 h[5]=25 host_seen=25",
        "run3 update=cudaSuccess h[5]=12 err=cudaSuccess",
    ]


def test_illegal_calls_during_capture(program, run_guest) -> None:
    r = run_guest(program("graph_errors.cu"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "memcpy=cudaErrorStreamCaptureImplicit status=2 "  # as the H100 answers
        "launch_after=cudaErrorStreamCaptureInvalidated "
        "end=cudaErrorStreamCaptureInvalidated graph_null=1",
        "stream_sync=cudaErrorStreamCaptureUnsupported end=cudaErrorStreamCaptureInvalidated",
        "begin_legacy=cudaErrorStreamCaptureUnsupported end_idle=cudaErrorIllegalState",
        "legacy_launch=cudaErrorStreamCaptureImplicit end=cudaErrorStreamCaptureInvalidated",
        "event_query=cudaErrorCapturedEvent",
        "unjoined end=cudaErrorStreamCaptureUnjoined s2_status=0",
        # nothing recorded in a failed capture ran; the relaxed capture's graph did
        "relaxed malloc=cudaSuccess end=cudaSuccess h[0]=5 h[63]=5",
        "global malloc=cudaErrorStreamCaptureUnsupported end=cudaErrorStreamCaptureInvalidated",
        "after sync=cudaSuccess h[0]=105",
    ]
