"""Cluster launches through the guest session library (GuestSession.launch_cluster) on a
daemon serving the simulated H100: the launch runs as clusters, and launches the driver
refuses fail at the call with its error codes."""

from __future__ import annotations

import numpy as np
import pytest

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.guest.session import GuestSession

KERNELS = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
// out[block] = the block's cluster rank * 100 + the sum over the cluster of its blocks' ids,
// gathered through distributed shared memory
extern "C" __global__ void gather(int *out)
{
    __shared__ int id;
    cg::cluster_group cl = cg::this_cluster();
    if (threadIdx.x == 0) id = blockIdx.y * gridDim.x + blockIdx.x;
    cl.sync();
    if (threadIdx.x == 0) {
        int sum = 0;
        for (unsigned r = 0; r < cl.num_blocks(); r++) sum += *cl.map_shared_rank(&id, r);
        out[id] = cl.block_rank() * 100 + sum;
    }
    cl.sync();
}
"""


@pytest.fixture
def gather(session: GuestSession, cuda_build):  # type: ignore[no-untyped-def]
    image = cuda_build(
        KERNELS, "-fatbin", "-gencode", "arch=compute_90,code=compute_90", suffix=".fatbin"
    )
    return session.module_get_function(session.module_load(image.read_bytes()), "gather")


def _expected(grid: tuple[int, int], cluster: tuple[int, int]) -> np.ndarray:
    gx, gy = grid
    cx, cy = cluster
    out = np.zeros(gx * gy, np.int32)
    for y in range(gy):
        for x in range(gx):
            x0, y0 = x - x % cx, y - y % cy
            ids = [(y0 + j) * gx + x0 + i for j in range(cy) for i in range(cx)]
            out[y * gx + x] = ((x % cx) + (y % cy) * cx) * 100 + sum(ids)
    return out


@pytest.mark.parametrize(("grid", "cluster"), [((8, 2), (4, 1)), ((6, 4), (3, 2))])
def test_launch_cluster_runs_clusters(session: GuestSession, gather, grid, cluster) -> None:  # type: ignore[no-untyped-def]
    n = grid[0] * grid[1]
    out = session.mem_alloc(4 * n)
    session.launch_cluster(gather, grid, (64,), cluster, [out])
    got = np.frombuffer(session.memcpy_dtoh(out, 4 * n), np.int32)
    np.testing.assert_array_equal(got, _expected(grid, cluster))


@pytest.mark.parametrize(
    ("grid", "cluster", "kw"),
    [
        ((6, 1), (4, 1), {}),
        ((16, 1), (16, 1), {}),
        ((32, 1), (32, 1), {"non_portable_cluster": True}),
    ],
)
def test_refused_cluster_launches_fail_at_the_call(  # type: ignore[no-untyped-def]
    session: GuestSession, gather, grid, cluster, kw
) -> None:
    out = session.mem_alloc(4 * 32)
    with pytest.raises(CudaError) as e:
        session.launch_cluster(gather, grid, (64,), cluster, [out], **kw)
    assert e.value.code == CUresult.CUDA_ERROR_INVALID_CLUSTER_SIZE
    session.synchronize()  # nothing was sent: the session is healthy


def test_sixteen_block_clusters_when_non_portable(session: GuestSession, gather) -> None:  # type: ignore[no-untyped-def]
    out = session.mem_alloc(4 * 32)
    session.launch_cluster(gather, (32, 1), (32,), (16, 1), [out], non_portable_cluster=True)
    got = np.frombuffer(session.memcpy_dtoh(out, 4 * 32), np.int32)
    np.testing.assert_array_equal(got, _expected((32, 1), (16, 1)))
