"""Migration pre-flight between two daemons on the cuda backend (``--backend cuda:0``).

A pre-flight compares what the destination's device *reports* with what the session needs, for
every backend. Both daemons here run the cuda backend: on a GPU host against the NVIDIA driver
(two daemons on one GPU), elsewhere against Crane's own ``libcuda.so.1`` in front of a daemon on
the simulated H100 (see conftest.py), so the daemons inventory their GPU through cuda-python
exactly as they would without NVML. The source side is the function a migrating worker runs
(:func:`crane.migrate.source.preflight`), asking the destination over its Peer service.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.craned.launcher import DaemonProcess
from crane.migrate.source import MigrationFailed, preflight
from crane.state.session_record import SessionRecord
from crane.v1 import peer_pb2_grpc
from crane.wire.channel import open_channel

ROOT = Path(__file__).resolve().parents[2]
OPTIN = int(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)

SOURCE = r"""
extern "C" __global__ void twice(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2.0f;
}
"""


@pytest.fixture(scope="module")
def cuda_pair(
    driver_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    root = tmp_path_factory.mktemp("cuda-daemons")
    a = DaemonProcess(root / "a", ["cuda:0"], env=driver_env)
    try:
        b = DaemonProcess(root / "b", ["cuda:0"], env=driver_env)
    except BaseException:
        a.stop()
        raise
    try:
        yield a, b
    finally:
        b.stop()
        a.stop()


@pytest.fixture(scope="module")
def told(driver_env: dict[str, str]) -> dict[int, int]:
    """What a guest of the source daemon is told: every attribute CUDA reports for GPU 0 (the
    cuda backend tells its guests exactly these; the probe reads them the same way)."""
    p = subprocess.run(
        [sys.executable, "-m", "crane.backends.cuda.probe"],
        env=driver_env,
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        check=True,
    )
    gpu = json.loads(p.stdout)["gpus"][0]
    return {int(k): int(v) for k, v in gpu["attributes"].items()}


def _ident(told: dict[int, int], slot: int = 7) -> SessionRecord:
    return SessionRecord(id="0123456789ab", token=bytes(16), slot=slot, told=told)


def _stub(d: DaemonProcess) -> peer_pb2_grpc.PeerStub:
    return peer_pb2_grpc.PeerStub(open_channel(d.address))


def test_both_daemons_serve_the_gpu_through_the_cuda_backend(
    cuda_pair: tuple[DaemonProcess, DaemonProcess],
) -> None:
    for d in cuda_pair:
        assert "device 0: cuda:0 (" in d.log_text()


def test_a_session_of_one_cuda_daemon_may_move_to_the_other(
    cuda_pair: tuple[DaemonProcess, DaemonProcess], told: dict[int, int], cuda_build
) -> None:  # type: ignore[no-untyped-def]
    a, b = cuda_pair
    image = cuda_build(
        SOURCE, "-fatbin", "-gencode", "arch=compute_80,code=compute_80", suffix=".fatbin"
    ).read_bytes()
    digest = hashlib.sha256(image).hexdigest()
    for dst in (b, a):  # each way between the two daemons
        held = preflight(
            _stub(dst), dst.address, _ident(told), [digest], 64 << 20, -1, {digest: image}.get
        )
        assert held == set()  # the destination lacks the image: checked here, and usable
    assert "refused" not in a.log_text() + b.log_text()


def test_refusals_name_what_the_destination_gpu_reports(
    cuda_pair: tuple[DaemonProcess, DaemonProcess], told: dict[int, int]
) -> None:
    _, b = cuda_pair
    more = {**told, OPTIN: told[OPTIN] + 1024}
    with pytest.raises(MigrationFailed) as e:
        preflight(_stub(b), b.address, _ident(more), [], 1 << 50, -1, lambda d: None)
    why = str(e.value)
    assert "device 0 (cuda:0 " in why and "offers less than the guest was told" in why, why
    assert (
        f"max shared memory per block (opt-in) (told {told[OPTIN] + 1024}, offered {told[OPTIN]})"
        in why
    ), why
    assert "too little free device memory: the session holds 1073741824 MiB" in why, why
    with pytest.raises(MigrationFailed, match="no device 3 on this daemon"):
        preflight(_stub(b), b.address, _ident(told), [], 0, 3, lambda d: None)
