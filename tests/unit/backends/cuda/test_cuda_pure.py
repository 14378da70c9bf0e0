"""Pure logic of the cuda backend and the GPU inventory (no driver needed)."""

from __future__ import annotations

import enum
import os
from pathlib import Path

import pytest

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.backends.cuda.device import profile_key, virtual_uuid
from crane.backends.cuda.driver import unwrap
from crane.daemon import devices
from crane.daemon.gpu_inventory import GpuInfo


class _Err(enum.IntEnum):  # stands in for cuda-python's CUresult enum values
    CUDA_SUCCESS = 0
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_SOMETHING_NEW = 9999


def test_check_unwraps_values_and_raises_the_drivers_code() -> None:
    assert unwrap("cuX", (_Err.CUDA_SUCCESS,)) is None
    assert unwrap("cuX", (_Err.CUDA_SUCCESS, 7)) == 7
    assert unwrap("cuX", (_Err.CUDA_SUCCESS, 7, 8)) == (7, 8)
    with pytest.raises(CudaError) as e:
        unwrap("cuMemCreate", (_Err.CUDA_ERROR_OUT_OF_MEMORY, None))
    assert e.value.code == CUresult.CUDA_ERROR_OUT_OF_MEMORY
    assert "cuMemCreate" in e.value.message and "OUT_OF_MEMORY" in e.value.message
    with pytest.raises(CudaError) as e:  # a code newer than our cuda.h is passed through
        unwrap("cuY", (_Err.CUDA_ERROR_SOMETHING_NEW,))
    assert int(e.value.code) == 9999


def test_virtual_uuid_is_stable_per_seed_and_differs_between_seeds() -> None:
    key = profile_key("NVIDIA H100 80GB HBM3")
    assert key == "cuda:NVIDIA H100 80GB HBM3"
    a = virtual_uuid(key, b"\x01" * 16)
    assert a == virtual_uuid(key, b"\x01" * 16) and len(a) == 16
    assert a != virtual_uuid(key, b"\x02" * 16)
    assert a != virtual_uuid(profile_key("NVIDIA H200"), b"\x01" * 16)
    assert a[6] >> 4 == 5  # RFC 4122 version 5


GPUS = [
    GpuInfo(0, "NVIDIA H100 80GB HBM3", "GPU-aaaa", 80 << 30, (9, 0), "0000:3b:00.0", "580"),
    GpuInfo(1, "NVIDIA H200", "GPU-bbbb", 141 << 30, (9, 0), "0000:5e:00.0", "580"),
]


@pytest.mark.parametrize(
    ("arg", "index"), [("", 0), ("0", 0), ("1", 1), ("GPU-bbbb", 1), ("gpu-AAAA", 0)]
)
def test_cuda_spec_picks_a_gpu_by_index_or_uuid(arg: str, index: int) -> None:
    assert devices._pick_gpu(GPUS, arg, f"cuda:{arg}").index == index


@pytest.mark.parametrize(
    ("arg", "why"),
    [("2", "has 2 GPU"), ("GPU-cccc", "no GPU with UUID"), ("first", "cuda:INDEX")],
)
def test_cuda_spec_refuses_what_it_cannot_find(arg: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        devices._pick_gpu(GPUS, arg, f"cuda:{arg}")


def test_cuda_devices_use_the_inventory_and_pci_order(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(devices, "_probe_gpus", lambda: (GPUS, "NVML found 2 GPU(s)"))
    monkeypatch.setattr(devices, "_cuda_backend_missing", lambda: "")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    found, note = devices.resolve_devices(["cuda:1", "auto", "sim:l4"], tmp_path)
    assert [(d.backend, d.arg, d.name) for d in found] == [
        ("cuda", "1", "NVIDIA H200"),
        ("cuda", "0", "NVIDIA H100 80GB HBM3"),
        ("sim", "l4", found[2].name),
    ]
    assert found[0].uuid == "GPU-bbbb" and found[0].driver_version == "580"
    assert "auto: NVML found 2 GPU(s) -> cuda:0" in note
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_auto_says_why_it_falls_back_to_the_simulator(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(devices, "_probe_gpus", lambda: (GPUS, "NVML found 2 GPU(s)"))
    monkeypatch.setattr(devices, "_cuda_backend_missing", lambda: "cuda-python is not installed")
    found, note = devices.resolve_devices(["auto"], tmp_path)
    assert found[0].backend == "sim"
    assert "cuda backend cannot run: cuda-python is not installed" in note
    with pytest.raises(ValueError, match="cuda-python is not installed"):
        devices.resolve_devices(["cuda:0"], tmp_path)
