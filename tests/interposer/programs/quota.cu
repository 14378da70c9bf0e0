// Run as a tenant whose device-memory limit is 1 GiB (tests/interposer/test_quota_programs.py):
// every way a CUDA program commits device memory counts against it, and the program can handle
// the out-of-memory error and carry on.
#include <cuda.h>
#include <cuda_runtime.h>

#include "check.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

// 256 MiB of module globals: charged when the module loads
__device__ char big_global[256 * MiB];

__global__ void touch(char* p, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i * 4096] = 1;
    if (i == 0) big_global[256 * MiB - 1] = 2;
}

int main() {
    cudaStream_t s;
    cudaStreamCreate(&s);
    touch<<<1, 1, 0, s>>>(nullptr, 0);  // loads the module (lazily loaded at the first launch)
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "first launch");
    size_t free0 = 0, total0 = 0;
    CHECK(cudaMemGetInfo(&free0, &total0) == cudaSuccess, "memGetInfo");
    // the tenant's view: its limit, less the module's 256 MiB
    printf("view total=%zu used=%zu\n", total0, total0 - free0);
    CHECK(total0 == GiB, "total %zu", total0);

    // stream-ordered pool allocations
    void *a = nullptr, *b = nullptr;
    CHECK(cudaMallocAsync(&a, 512 * MiB, s) == cudaSuccess, "pool alloc a");
    cudaError_t e = cudaMallocAsync(&b, 512 * MiB, s);
    printf("pool past limit=%s\n", cudaGetErrorName(e));
    cudaGetLastError();
    touch<<<1, 32, 0, s>>>((char*)a, 32);  // a is intact and usable
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "kernel on a");
    CHECK(cudaFreeAsync(a, s) == cudaSuccess, "free a");
    cudaMemPool_t pool;
    cudaDeviceGetDefaultMemPool(&pool, 0);
    cudaStreamSynchronize(s);
    cudaMemPoolTrimTo(pool, 0);
    CHECK(cudaMallocAsync(&b, 512 * MiB, s) == cudaSuccess, "pool alloc after free");
    cudaFreeAsync(b, s);
    cudaStreamSynchronize(s);
    cudaMemPoolTrimTo(pool, 0);

    // managed memory is mirrored in device memory: charged too
    void *m1 = nullptr, *m2 = nullptr;
    CHECK(cudaMallocManaged(&m1, 600 * MiB) == cudaSuccess, "managed m1");
    e = cudaMallocManaged(&m2, 600 * MiB);
    printf("managed past limit=%s\n", cudaGetErrorName(e));
    cudaGetLastError();
    cudaFree(m1);

    // the driver's VMM: cuMemCreate refuses what the tenant cannot hold
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h;
    CUresult r = cuMemCreate(&h, 1 * GiB, &prop, 0);
    const char* name = nullptr;
    cuGetErrorName(r, &name);
    printf("vmm past limit=%s\n", name);
    CHECK(cuMemCreate(&h, 512 * MiB, &prop, 0) == CUDA_SUCCESS, "vmm create within");
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, 512 * MiB, 0, 0, 0) == CUDA_SUCCESS, "reserve");
    CHECK(cuMemMap(va, 512 * MiB, 0, h, 0) == CUDA_SUCCESS, "map");
    cuMemUnmap(va, 512 * MiB);
    cuMemRelease(h);
    cuMemAddressFree(va, 512 * MiB);

    size_t free1 = 0, total1 = 0;
    cudaMemGetInfo(&free1, &total1);
    printf("back to start=%d\n", free1 == free0);
    return finish();
}
