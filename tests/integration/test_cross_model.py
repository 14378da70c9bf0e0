"""Moving a session down, H100 -> A100 (both simulated, mutual TLS between the daemons), live
and through a checkpoint file: the pre-flight weighs what the session *uses* against what it was
merely *told*.

Without a baseline model the guest was told the H100's limits (232448 bytes of opt-in shared
memory per block; the A100 offers 166912), so the move is refused, naming the attributes and the
two ways out; accepted (``--accept-lower-limits``) it goes, the program finishes bit-identically,
and a later request beyond the A100's limits fails with the error the GPU gives
(CUDA_ERROR_INVALID_VALUE), not a crash. A session that *uses* more shared memory per block than
the A100 has is refused whatever the flag."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.cli.control_client import ControlClient
from crane.cli.main import main as crane_main
from crane.cli.migrate import migrate
from crane.craned.launcher import DaemonProcess
from crane.guest.session import Function, GuestSession
from tests.integration.net import tcp_address
from tests.integration.workload import Workload, reference

STEPS, MOVE_AT = 60, 20
OPTIN = int(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
A100_OPTIN, H100_OPTIN = 166912, 232448
BIG = 200_000  # bytes of dynamic shared memory: the H100 has them per block, the A100 not

SMEM_SRC = r"""
extern "C" __global__ void smem(float *out, int n)
{
    extern __shared__ float buf[];
    int t = threadIdx.x;
    int words = n / 4;                      /* the dynamic shared memory this launch has */
    for (int i = t; i < words; i += blockDim.x) buf[i] = (float)i;
    __syncthreads();
    out[t] = buf[(t * 37) % words] + buf[words - 1];
}
"""


@pytest.fixture
def smem_image(cuda_build) -> bytes:  # type: ignore[no-untyped-def]
    return cuda_build(
        SMEM_SRC, "-fatbin", "-gencode", "arch=compute_80,code=compute_80", suffix=".fatbin"
    ).read_bytes()


def _smem(s: GuestSession, image: bytes) -> Function:
    return s.module_get_function(s.module_load(image), "smem")


def _run_smem(s: GuestSession, fn: Function, shared: int, raised: int | None = None) -> list[float]:
    """One block of 128 threads with ``shared`` bytes of dynamic shared memory (the function's
    limit raised to ``raised``, as the guest's runtime remembers it); its output."""
    out = s.mem_alloc(128 * 4)
    s.launch(
        fn,
        grid=(1,),
        block=(128,),
        params=[out, shared],
        shared=shared,
        max_dynamic_shared=raised,
    )
    got = np.frombuffer(s.memcpy_dtoh(out, 128 * 4), dtype=np.float32).tolist()
    s.mem_free(out)
    return got


def _expected(shared: int) -> list[float]:
    words = shared // 4
    return [float((t * 37) % words + words - 1) for t in range(128)]


def _cuda_error(call: object) -> CudaError:
    with pytest.raises(CudaError) as e:
        call()  # type: ignore[operator]
    return e.value


def _exceeding_the_a100_fails_as_on_a_gpu(s: GuestSession, fn: Function) -> None:
    """The guest still believes the H100's limits (it cached them); the A100's are enforced:
    cuFuncSetAttribute beyond its opt-in maximum, then a launch beyond what the function may
    use, each CUDA_ERROR_INVALID_VALUE; the session carries on."""
    assert s.device.attributes[OPTIN] == H100_OPTIN
    s.function_set_max_dynamic_shared(fn, BIG)  # deferred, as every asynchronous call's error
    assert _cuda_error(s.synchronize).code == CUresult.CUDA_ERROR_INVALID_VALUE
    e = _cuda_error(lambda: _run_smem(s, fn, BIG, BIG))
    assert e.code == CUresult.CUDA_ERROR_INVALID_VALUE, e
    s.function_set_max_dynamic_shared(fn, A100_OPTIN)  # what the A100 has: allowed
    assert _run_smem(s, fn, A100_OPTIN, A100_OPTIN) == _expected(A100_OPTIN)


def _refusal_says_why_and_the_ways_out(why: str) -> None:
    assert "max shared memory per block (opt-in) (told 232448, offered 166912)" in why, why
    assert "--accept-lower-limits" in why and "crane baseline" in why, why


def _stays(d: DaemonProcess, sid: str) -> None:
    with ControlClient(d.address) as c:
        assert [x.id for x in c.sessions().sessions if x.state != "migrated"] == [sid]


def test_live_down_needs_acceptance_then_finishes_identically(
    daemons: tuple[DaemonProcess, DaemonProcess], image: bytes, smem_image: bytes
) -> None:
    h100, a100 = daemons
    want = reference(h100.address, image, STEPS)
    with GuestSession(tcp_address(h100), client="down") as s:
        w = Workload(s, image)
        fn = _smem(s, smem_image)
        assert _run_smem(s, fn, 8192) == _expected(8192)  # uses 8 KiB per block: fine anywhere
        w.run(MOVE_AT)
        last = migrate(h100.address, s.session_id, tcp_address(a100))[-1]
        assert last.phase == "failed"
        _refusal_says_why_and_the_ways_out(last.error)
        _stays(h100, s.session_id)
        w.run(5)  # it runs on where it was
        argv = ["--daemon", h100.address, "migrate", "--session", s.session_id]
        assert crane_main([*argv, "--to", tcp_address(a100), "--accept-lower-limits"]) == 0
        w.run(STEPS - MOVE_AT - 5)
        assert s._t.resumes == 1
        _stays(a100, s.session_id)
        assert w.result() == want
        _exceeding_the_a100_fails_as_on_a_gpu(s, fn)
        assert w.result() == want  # nothing else was disturbed
    assert "accepted lower limits" in a100.log_text()


def test_live_using_more_than_the_destination_has_is_refused_whatever_the_flag(
    daemons: tuple[DaemonProcess, DaemonProcess], smem_image: bytes
) -> None:
    h100, a100 = daemons
    with GuestSession(tcp_address(h100), client="big") as s:
        fn = _smem(s, smem_image)
        s.function_set_max_dynamic_shared(fn, BIG)
        assert _run_smem(s, fn, BIG, BIG) == _expected(BIG)  # the H100 has it
        last = migrate(h100.address, s.session_id, tcp_address(a100), accept_lower_limits=True)[-1]
        assert last.phase == "failed"
        assert (
            f"the session uses {BIG} bytes of shared memory per block (smem), "
            f"device 0 (a100-80gb, sm_80) has {A100_OPTIN}"
        ) in last.error, last.error
        _stays(h100, s.session_id)
        assert _run_smem(s, fn, BIG, BIG) == _expected(BIG)  # still on the H100, still working


def _checkpoint(h100: DaemonProcess, sid: str, name: str) -> None:
    argv = ["--daemon", h100.address, "checkpoint", "--session", sid, "-o", name, "--release"]
    assert crane_main(argv) == 0


def test_restore_down_needs_acceptance_then_finishes_identically(
    daemons: tuple[DaemonProcess, DaemonProcess],
    image: bytes,
    smem_image: bytes,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    h100, a100 = daemons
    want = reference(h100.address, image, STEPS)
    with GuestSession(h100.address, client="file", alternates=[a100.address]) as s:
        w = Workload(s, image)
        fn = _smem(s, smem_image)
        assert _run_smem(s, fn, 8192) == _expected(8192)
        w.run(MOVE_AT)
        _checkpoint(h100, s.session_id, "down.ckpt")
        assert crane_main(["restore", "down.ckpt", "--daemon", a100.address]) == 1
        _refusal_says_why_and_the_ways_out(capsys.readouterr().err)
        with ControlClient(a100.address) as c:
            assert list(c.sessions().sessions) == []
        argv = ["restore", "down.ckpt", "--daemon", a100.address, "--accept-lower-limits"]
        assert crane_main(argv) == 0
        w.run(STEPS - MOVE_AT)
        assert s._t.address == a100.address
        assert w.result() == want
        _exceeding_the_a100_fails_as_on_a_gpu(s, fn)


def test_restore_using_more_than_the_device_has_is_refused_whatever_the_flag(
    daemons: tuple[DaemonProcess, DaemonProcess],
    smem_image: bytes,
    capsys: pytest.CaptureFixture[str],
) -> None:
    h100, a100 = daemons
    with GuestSession(h100.address, client="big-file", alternates=[a100.address]) as s:
        fn = _smem(s, smem_image)
        s.function_set_max_dynamic_shared(fn, BIG)  # configured: a need, launched or not
        s.synchronize()
        _checkpoint(h100, s.session_id, "big.ckpt")
        argv = ["restore", "big.ckpt", "--daemon", a100.address, "--accept-lower-limits"]
        assert crane_main(argv) == 1
        err = capsys.readouterr().err
        assert f"the session uses {BIG} bytes of shared memory per block (smem)" in err, err
        with ControlClient(h100.address, timeout=None) as c:
            c.restore("big.ckpt")  # back where it can run
        assert _run_smem(s, fn, BIG, BIG) == _expected(BIG)
