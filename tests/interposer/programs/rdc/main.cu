// Relocatable device code across three translation units (nvcc -rdc=true, PTX only): the
// kernel calls __device__ functions defined in other files, reads and writes __device__
// variables defined elsewhere, uses an inline function each file instantiates (.weak), and
// each file has a static helper and printf strings of the same name (module-local symbols).
#include <cstdio>
#include "shared.h"

static __device__ __noinline__ int local_tag() { return 100; }  // also defined (static) in ops.cu

__global__ void run(int *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = poly(i) + offset_of(i) + twice(i) + local_tag();
    atomicAdd(&hits, 1);
    if (i == 0) printf("main: bias=%d\n", bias);
}

int main() {
    const int n = 64;
    int *d = nullptr;
    cudaMalloc(&d, n * sizeof(int));
    run<<<2, 32>>>(d, n);
    cudaError_t e = cudaDeviceSynchronize();
    int h[n];
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    int hits_h = 0, bias_h = 0;
    cudaMemcpyFromSymbol(&hits_h, hits, sizeof hits_h);
    cudaMemcpyFromSymbol(&bias_h, bias, sizeof bias_h);
    bool ok = true;
    for (int i = 0; i < n; ++i) {
        int want = (3 * i * i + 1) + (i + 7 + 1000) + 2 * i + 100;
        if (h[i] != want) {
            printf("mismatch at %d: %d != %d\n", i, h[i], want);
            ok = false;
            break;
        }
    }
    printf("sync=%s h[5]=%d hits=%d bias=%d ok=%d\n", cudaGetErrorString(e), h[5], hits_h,
           bias_h, ok);
    return ok ? 0 : 1;
}
