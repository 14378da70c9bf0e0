// Profiler control, occupancy, context limits, stream attributes and settable function
// attributes, through cudart and the driver API, each checked against what CUDA documents.
#include <cstdio>
#include <cstring>
#include <cuda.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include "check.h"

__global__ void scale(float *x, int n) {
    extern __shared__ float tile[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? x[i] : 0.f;
    __syncthreads();
    if (i < n) x[i] = tile[threadIdx.x] * 2.f;
}

static size_t smem_per_block(int block) { return (size_t)block * 96; }

int main() {
    CHECK(cudaProfilerStart() == cudaSuccess, "cudaProfilerStart");
    CHECK(cudaProfilerStop() == cudaSuccess, "cudaProfilerStop");

    // ---- occupancy: cudart's own search (cuda_runtime.h) against the driver's --------------
    int rt_grid = 0, rt_block = 0;
    CHECK(cudaOccupancyMaxPotentialBlockSizeVariableSMem(&rt_grid, &rt_block, scale,
                                                         smem_per_block) == cudaSuccess,
          "cudart potential block size");
    CUfunction f;
    CHECK(cudaGetFuncBySymbol(&f, (const void *)scale) == cudaSuccess, "cudaGetFuncBySymbol");
    int drv_grid = 0, drv_block = 0;
    CHECK(cuOccupancyMaxPotentialBlockSize(&drv_grid, &drv_block, f, smem_per_block, 0, 0) ==
              CUDA_SUCCESS,
          "driver potential block size");
    CHECK(rt_grid == drv_grid && rt_block == drv_block, "cudart %d/%d vs driver %d/%d", rt_grid,
          rt_block, drv_grid, drv_block);
    int blocks = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, scale, drv_block,
                                                  smem_per_block(drv_block));
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    CHECK(drv_grid == blocks * prop.multiProcessorCount, "min grid %d = %d blocks x %d SMs",
          drv_grid, blocks, prop.multiProcessorCount);
    CHECK(drv_block % 32 == 0 && drv_block <= 1024, "block %d", drv_block);
    int lim_grid = 0, lim_block = 0;
    CHECK(cuOccupancyMaxPotentialBlockSizeWithFlags(&lim_grid, &lim_block, f, NULL, 1024, 200,
                                                    0) == CUDA_SUCCESS,
          "driver potential block size, limit 200");
    CHECK(lim_block <= 200 && lim_block > 0, "limited block %d", lim_block);
    int fixed_grid = 0, fixed_block = 0;
    cudaOccupancyMaxPotentialBlockSize(&fixed_grid, &fixed_block, scale, 1024, 200);
    CHECK(fixed_grid == lim_grid && fixed_block == lim_block, "fixed smem: %d/%d vs %d/%d",
          fixed_grid, fixed_block, lim_grid, lim_block);

    // ---- context limits ------------------------------------------------------------------
    size_t v = 0;
    CHECK(cudaDeviceSetLimit(cudaLimitStackSize, 3000) == cudaSuccess, "stack");
    cudaDeviceGetLimit(&v, cudaLimitStackSize);
    CHECK(v >= 3000 && v % 16 == 0, "stack size %zu", v);
    CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 64 << 20) == cudaSuccess, "heap");
    cudaDeviceGetLimit(&v, cudaLimitMallocHeapSize);
    CHECK(v == (64 << 20), "heap %zu", v);
    CHECK(cudaDeviceSetLimit(cudaLimitPrintfFifoSize, 4 << 20) == cudaSuccess, "fifo");
    cudaDeviceGetLimit(&v, cudaLimitPrintfFifoSize);
    CHECK(v == (4 << 20), "fifo %zu", v);
    CHECK(cudaDeviceSetLimit(cudaLimitMaxL2FetchGranularity, 128) == cudaSuccess, "L2 fetch");
    cudaDeviceGetLimit(&v, cudaLimitMaxL2FetchGranularity);
    CHECK(v == 128, "L2 fetch %zu", v);
    CHECK(cudaDeviceSetLimit(cudaLimitMaxL2FetchGranularity, 100) == cudaErrorInvalidValue,
          "L2 fetch 100 refused");
    cudaGetLastError();
    CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, (size_t)1 << 40) == cudaSuccess,
          "persisting L2");
    cudaDeviceGetLimit(&v, cudaLimitPersistingL2CacheSize);
    CHECK(v == (size_t)prop.persistingL2CacheMaxSize, "persisting L2 %zu clamped to %d", v,
          prop.persistingL2CacheMaxSize);
    CHECK(cudaCtxResetPersistingL2Cache() == cudaSuccess, "reset persisting L2");
    CHECK(cudaDeviceGetLimit(&v, (cudaLimit)77) == cudaErrorUnsupportedLimit, "unknown limit");
    cudaGetLastError();

    // ---- stream attributes ---------------------------------------------------------------
    cudaStream_t s, t;
    cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, 0);
    cudaStreamCreate(&t);
    float *d;
    cudaMalloc(&d, 1 << 20);
    cudaStreamAttrValue a;
    memset(&a, 0, sizeof a);
    a.accessPolicyWindow.base_ptr = d;
    a.accessPolicyWindow.num_bytes = 1 << 20;
    a.accessPolicyWindow.hitRatio = 0.6f;
    a.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    a.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    CHECK(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &a) == cudaSuccess,
          "set access policy window");
    cudaStreamAttrValue b;
    memset(&b, 0, sizeof b);
    CHECK(cudaStreamGetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &b) == cudaSuccess,
          "get access policy window");
    CHECK(b.accessPolicyWindow.base_ptr == d && b.accessPolicyWindow.num_bytes == (1 << 20) &&
              b.accessPolicyWindow.hitRatio == 0.6f &&
              b.accessPolicyWindow.hitProp == cudaAccessPropertyPersisting,
          "window read back");
    a.accessPolicyWindow.hitRatio = 1.5f;
    CHECK(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &a) ==
              cudaErrorInvalidValue,
          "hit ratio 1.5 refused");
    cudaGetLastError();
    memset(&a, 0, sizeof a);
    a.priority = -3;
    CHECK(cudaStreamSetAttribute(s, cudaStreamAttributePriority, &a) == cudaSuccess, "priority");
    int prio = 0;
    cudaStreamGetPriority(s, &prio);
    CHECK(prio == -3, "priority %d", prio);
    memset(&a, 0, sizeof a);
    a.syncPolicy = cudaSyncPolicyBlockingSync;
    CHECK(cudaStreamSetAttribute(s, cudaStreamAttributeSynchronizationPolicy, &a) == cudaSuccess,
          "sync policy");
    CHECK(cudaStreamCopyAttributes(t, s) == cudaSuccess, "copy attributes");
    memset(&b, 0, sizeof b);
    cudaStreamGetAttribute(t, cudaStreamAttributeSynchronizationPolicy, &b);
    CHECK(b.syncPolicy == cudaSyncPolicyBlockingSync, "copied sync policy %d", (int)b.syncPolicy);
    cudaStreamGetPriority(t, &prio);
    CHECK(prio == -3, "copied priority %d", prio);

    // ---- function attributes -------------------------------------------------------------
    CHECK(cudaFuncSetAttribute(scale, cudaFuncAttributePreferredSharedMemoryCarveout, 50) ==
              cudaSuccess,
          "carveout");
    CHECK(cudaFuncSetAttribute(scale, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
              cudaSuccess,
          "non-portable cluster size");
    CHECK(cudaFuncSetAttribute(scale, cudaFuncAttributeClusterSchedulingPolicyPreference,
                               cudaClusterSchedulingPolicySpread) == cudaSuccess,
          "scheduling policy");
    CHECK(cudaFuncSetAttribute(scale, cudaFuncAttributeClusterSchedulingPolicyPreference, 7) ==
              cudaErrorInvalidValue,
          "bad scheduling policy refused");
    cudaGetLastError();
    cudaFuncAttributes fa;
    cudaFuncGetAttributes(&fa, scale);
    CHECK(fa.preferredShmemCarveout == 50 && fa.nonPortableClusterSizeAllowed == 1 &&
              fa.clusterSchedulingPolicyPreference == cudaClusterSchedulingPolicySpread,
          "attributes read back: carveout %d non-portable %d policy %d",
          fa.preferredShmemCarveout, fa.nonPortableClusterSizeAllowed,
          fa.clusterSchedulingPolicyPreference);

    // the kernel still runs with its attributes and a stream's hints set
    float h[256];
    for (int i = 0; i < 256; i++) h[i] = (float)i;
    cudaMemcpyAsync(d, h, sizeof h, cudaMemcpyHostToDevice, s);
    scale<<<2, 128, 128 * sizeof(float), s>>>(d, 256);
    cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, s);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "run");
    CHECK(h[255] == 510.f && h[1] == 2.f, "results %f %f", h[1], h[255]);

    return finish();
}
