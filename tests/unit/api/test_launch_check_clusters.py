"""The driver's cluster-launch rules (crane.api.launch_check.check_cluster) and the cluster
occupancy count, as pure functions of the device's attributes."""

from __future__ import annotations

import pytest

from crane.api.generated.cuda_enums import CUdevice_attribute as A
from crane.api.generated.cuda_enums import CUresult
from crane.api.launch_check import check_cluster, max_active_blocks_per_sm, max_active_clusters
from crane.api.results import CudaError
from crane.backends.catalog import builtin_model

H100 = builtin_model("h100-80gb").snapshot(b"\x01" * 16).attributes
A100 = builtin_model("a100-80gb").snapshot(b"\x01" * 16).attributes
BAD = CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE


def _code(**kw) -> CUresult:
    with pytest.raises(CudaError) as e:
        check_cluster(**kw)
    return e.value.code


def test_no_cluster_is_none():
    assert check_cluster(H100, (7, 1, 1), None) is None
    assert check_cluster(H100, (7, 1, 1), (0, 0, 0)) is None
    assert check_cluster(A100, (7, 1, 1), None) is None  # no cluster asked: any device


def test_dims_padded_and_returned():
    assert check_cluster(H100, (8, 4, 1), (2, 2)) == (2, 2, 1)
    assert check_cluster(H100, (8, 1, 1), None, required=(4,)) == (4, 1, 1)
    assert check_cluster(H100, (8, 1, 1), (4, 1, 1), required=(4, 1, 1)) == (4, 1, 1)


@pytest.mark.parametrize(
    ("grid", "cluster", "kw"),
    [
        ((6, 1, 1), (4, 1, 1), {}),  # not a whole number of clusters
        ((4, 3, 1), (2, 2, 1), {}),
        ((16, 1, 1), (16, 1, 1), {}),  # above the portable 8
        ((32, 1, 1), (32, 1, 1), {"non_portable": True}),  # above 16
        ((8, 1, 1), (2, 1, 1), {"required": (4, 1, 1)}),  # contradicts the compiled shape
        ((8, 1, 1), (8, 1, 1), {"max_rank": 4}),
        ((8, 1, 1), None, {"explicit": True}),  # compiled for clusters, launched without
        ((8, 1, 1), (2, 0, 1), {}),  # a zero among positive dimensions
    ],
)
def test_refusals(grid, cluster, kw):
    assert _code(attributes=H100, grid=grid, cluster=cluster, **kw) == BAD


def test_non_portable_sixteen_and_a_device_without_clusters():
    assert check_cluster(H100, (16, 1, 1), (16, 1, 1), non_portable=True) == (16, 1, 1)
    code = _code(attributes=A100, grid=(4, 1, 1), cluster=(2, 1, 1))
    assert code == CUresult.CUDA_ERROR_NOT_SUPPORTED
    assert A100[A.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH] == 0


def test_active_clusters_count_per_gpc():
    """132 SMs: 7 GPCs of 18 and one of 6; clusters never straddle two GPCs."""
    per_sm = max_active_blocks_per_sm(H100, 1024, 0)  # 2 blocks of 1024 threads per SM
    assert per_sm == 2
    assert max_active_clusters(H100, 4, 1024, 0) == 7 * (36 // 4) + 12 // 4
    assert max_active_clusters(H100, 16, 1024, 0) == 7 * (36 // 16) + 0
    assert max_active_clusters(H100, 1, 1024, 0) == 132 * 2
    # shared memory that leaves one block per SM
    assert max_active_clusters(H100, 8, 128, 150 * 1024) == 7 * (18 // 8) + 6 // 8
    assert max_active_clusters(H100, 2, 2048, 0) == 0  # the block does not fit an SM
    with pytest.raises(CudaError):
        max_active_clusters(H100, 0, 128, 0)
