// Memory pools and stream-ordered allocation, each result checked against CUDA's documented
// behaviour: reuse within a stream, release thresholds, trim, attributes, custom pools.
#include <cstdint>
#include <cuda.h>
#include <cuda_runtime.h>

#include "check.h"

__global__ void fill(int *p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v + i;
}

static uint64_t attr(cudaMemPool_t pool, cudaMemPoolAttr a) {
    uint64_t v = 0;
    cudaMemPoolGetAttribute(pool, a, &v);
    return v;
}

int main() {
    cudaStream_t s;
    cudaStreamCreate(&s);
    cudaMemPool_t def;
    CHECK(cudaDeviceGetDefaultMemPool(&def, 0) == cudaSuccess, "default pool");
    cudaMemPool_t cur;
    cudaDeviceGetMemPool(&cur, 0);
    CHECK(cur == def, "the current pool starts as the default");

    // keep freed memory in the pool: the next allocation of that size in the stream reuses it
    uint64_t keep = UINT64_MAX;
    CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &keep) == cudaSuccess,
          "threshold");
    const int n = 1 << 16;
    int *a = nullptr, *b = nullptr;
    CHECK(cudaMallocAsync(&a, n * sizeof(int), s) == cudaSuccess, "malloc async");
    fill<<<n / 256, 256, 0, s>>>(a, n, 7);
    int h[4];
    cudaMemcpyAsync(h, a + 100, sizeof h, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    CHECK(h[0] == 107 && h[3] == 110, "kernel on pool memory: %d %d", h[0], h[3]);
    CHECK(attr(def, cudaMemPoolAttrUsedMemCurrent) >= n * sizeof(int), "used %llu",
          (unsigned long long)attr(def, cudaMemPoolAttrUsedMemCurrent));
    CHECK(cudaFreeAsync(a, s) == cudaSuccess, "free async");
    CHECK(attr(def, cudaMemPoolAttrUsedMemCurrent) == 0, "used after free");
    CHECK(attr(def, cudaMemPoolAttrReservedMemCurrent) >= n * sizeof(int), "kept reserved");
    cudaMallocAsync(&b, n * sizeof(int), s);
    CHECK(a == b, "reuse in the same stream: %p then %p", a, b);
    uint64_t high = attr(def, cudaMemPoolAttrUsedMemHigh);
    CHECK(high >= n * sizeof(int), "used high %llu", (unsigned long long)high);
    uint64_t zero = 0;
    CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrUsedMemHigh, &zero) == cudaSuccess,
          "reset high");
    cudaFreeAsync(b, s);
    CHECK(cudaMemPoolTrimTo(def, 0) == cudaSuccess, "trim");
    CHECK(attr(def, cudaMemPoolAttrReservedMemCurrent) == 0, "reserved after trim %llu",
          (unsigned long long)attr(def, cudaMemPoolAttrReservedMemCurrent));
    int one = 0;
    cudaMemPoolGetAttribute(def, cudaMemPoolReuseAllowOpportunistic, &one);
    CHECK(one == 1, "opportunistic reuse default %d", one);
    CHECK(cudaMemPoolSetAttribute(def, cudaMemPoolAttrUsedMemCurrent, &zero) ==
              cudaErrorInvalidValue,
          "read-only attribute refused");
    cudaGetLastError();

    // an explicit pool with a size limit, made the device's current pool
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    props.maxSize = 4 << 20;
    cudaMemPool_t pool;
    CHECK(cudaMemPoolCreate(&pool, &props) == cudaSuccess, "create pool");
    CHECK(cudaDeviceSetMemPool(0, pool) == cudaSuccess, "set current pool");
    int *c = nullptr;
    CHECK(cudaMallocAsync(&c, 1 << 20, s) == cudaSuccess, "alloc from current pool");
    CUmemoryPool owner = nullptr;
    cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, (CUdeviceptr)c);
    CHECK(owner == (CUmemoryPool)pool, "pointer's pool %p vs %p", (void *)owner, (void *)pool);
    int *d = nullptr;
    CHECK(cudaMallocFromPoolAsync(&d, 8 << 20, pool, s) == cudaErrorMemoryAllocation,
          "beyond the pool's maxSize");
    cudaGetLastError();
    fill<<<(1 << 18) / 256, 256, 0, s>>>(c, 1 << 18, 1);
    cudaMemcpyAsync(h, c + (1 << 18) - 4, sizeof h, cudaMemcpyDeviceToHost, s);
    cudaFreeAsync(c, s);
    cudaStreamSynchronize(s);
    CHECK(h[3] == (1 << 18), "kernel on the explicit pool: %d", h[3]);
    cudaMemAccessFlags fl;
    cudaMemLocation loc = {cudaMemLocationTypeDevice, 0};
    cudaMemPoolGetAccess(&fl, pool, &loc);
    CHECK(fl == cudaMemAccessFlagsProtReadWrite, "access %d", (int)fl);
    CHECK(cudaDeviceSetMemPool(0, def) == cudaSuccess, "back to the default pool");
    CHECK(cudaMemPoolDestroy(pool) == cudaSuccess, "destroy pool");
    CHECK(cudaMemPoolDestroy(def) == cudaErrorInvalidValue, "the default pool stays");
    cudaGetLastError();

    // what is not served says so
    props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
    CHECK(cudaMemPoolCreate(&pool, &props) == cudaErrorNotSupported, "IPC pools");
    cudaGetLastError();
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "clean end");
    return finish();
}
