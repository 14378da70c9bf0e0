// Unified addressing: page-locked host memory is addressable by the copy engine at its host
// address, whatever its allocation flags. Memsets and device-to-device copies naming pinned
// host memory run in stream order (after a kernel on the same stream); pageable memory named
// as a device pointer is refused.
#include <cstdlib>
#include <cstring>
#include <cuda.h>
#include <cuda_runtime.h>

#include "check.h"

__device__ int sym[4];

__global__ void fill(int *p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v + i;
}

int main() {
    const int n = 4096;
    int *d, *h;
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
    CHECK(cudaMalloc(&d, n * sizeof(int)) == cudaSuccess, "malloc");
    CHECK(cudaHostAlloc(&h, n * sizeof(int), cudaHostAllocDefault) == cudaSuccess, "hostalloc");
    memset(h, 0xff, n * sizeof(int));

    // a memset of pinned host memory through the driver, on a stream, after a kernel
    fill<<<n / 256, 256, 0, s>>>(d, n, 5);
    CUresult r = cuMemsetD32Async((CUdeviceptr)h, 0x01020304u, n, s);
    CHECK(r == CUDA_SUCCESS, "cuMemsetD32Async on pinned host memory: %d", (int)r);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    CHECK(h[0] == 0x01020304 && h[n - 1] == 0x01020304, "memset32 %x %x", h[0], h[n - 1]);
    r = cuMemsetD8((CUdeviceptr)h, 7, 16);
    CHECK(r == CUDA_SUCCESS && ((unsigned char *)h)[15] == 7 && h[4] == 0x01020304,
          "cuMemsetD8 %d", (int)r);
    cudaError_t e = cudaMemsetAsync(h, 0, n * sizeof(int), s);
    CHECK(e == cudaSuccess, "cudaMemsetAsync on pinned host memory: %s", cudaGetErrorName(e));
    CHECK(cudaStreamSynchronize(s) == cudaSuccess && h[n - 1] == 0, "after cudaMemsetAsync");

    // device -> pinned host and back as "device-to-device" copies, in stream order
    fill<<<n / 256, 256, 0, s>>>(d, n, 100);
    r = cuMemcpyDtoDAsync((CUdeviceptr)h, (CUdeviceptr)d, n * sizeof(int), s);
    CHECK(r == CUDA_SUCCESS, "DtoD device -> pinned host: %d", (int)r);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    CHECK(h[0] == 100 && h[n - 1] == 100 + n - 1, "copied %d %d", h[0], h[n - 1]);
    for (int i = 0; i < n; i++) h[i] = -i;
    r = cuMemcpyDtoD((CUdeviceptr)d, (CUdeviceptr)h, n * sizeof(int));
    CHECK(r == CUDA_SUCCESS, "DtoD pinned host -> device: %d", (int)r);
    int back[4];
    cudaMemcpy(back, d + n - 4, sizeof back, cudaMemcpyDeviceToHost);
    CHECK(back[3] == -(n - 1), "device got %d", back[3]);

    // pinned host memory as the "device" side of host<->device copies (XLA reads flags so)
    int flag[2] = {0, 0};
    h[0] = 41;
    h[1] = 42;
    r = cuMemcpyDtoHAsync(flag, (CUdeviceptr)h, sizeof flag, s);
    CHECK(r == CUDA_SUCCESS, "DtoH from pinned host memory: %d", (int)r);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess && flag[0] == 41 && flag[1] == 42,
          "read %d %d", flag[0], flag[1]);
    flag[0] = 7;
    r = cuMemcpyHtoD((CUdeviceptr)(h + 8), flag, sizeof(int));
    CHECK(r == CUDA_SUCCESS && h[8] == 7, "HtoD to pinned host memory: %d %d", (int)r, h[8]);

    // a module variable's address is device memory to unified (cudaMemcpyDefault) copies
    int *psym = nullptr, in[4] = {1, 2, 3, 4}, out[4] = {0, 0, 0, 0};
    CHECK(cudaGetSymbolAddress((void **)&psym, sym) == cudaSuccess, "symbol address");
    e = cudaMemcpy(psym, in, sizeof in, cudaMemcpyDefault);
    CHECK(e == cudaSuccess, "default copy to a symbol: %s", cudaGetErrorName(e));
    e = cudaMemcpy(out, psym, sizeof out, cudaMemcpyDefault);
    CHECK(e == cudaSuccess && out[3] == 4, "default copy from a symbol: %s %d",
          cudaGetErrorName(e), out[3]);

    // pageable memory is not device-addressable
    int *pageable = (int *)malloc(n * sizeof(int));
    r = cuMemsetD32((CUdeviceptr)pageable, 0, n);
    CHECK(r == CUDA_ERROR_INVALID_VALUE, "memset of pageable memory: %d", (int)r);
    r = cuMemcpyDtoD((CUdeviceptr)d, (CUdeviceptr)pageable, 64);
    CHECK(r == CUDA_ERROR_INVALID_VALUE, "DtoD from pageable memory: %d", (int)r);
    r = cuMemcpyDtoH(flag, (CUdeviceptr)pageable, sizeof flag);
    CHECK(r == CUDA_ERROR_INVALID_VALUE, "DtoH from pageable memory: %d", (int)r);
    free(pageable);
    cudaFreeHost(h);
    cudaFree(d);
    return finish();
}
