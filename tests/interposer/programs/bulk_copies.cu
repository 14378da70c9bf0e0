// Large copies through the CUDA runtime: pageable and page-locked host memory, synchronous
// and asynchronous on two streams, unaligned offsets and lengths, a kernel between upload and
// read-back. Over the call ring their bytes go through its bulk area; the output must be the
// same on every path.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

__global__ void bump(unsigned char *p, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = (unsigned char)(p[i] + 1);
}

static unsigned long long sum(const unsigned char *p, size_t n) {
    unsigned long long s = 0;
    for (size_t i = 0; i < n; i++) s = s * 1315423911ull + p[i];
    return s;
}

int main() {
    const size_t n = (13u << 20) + 4093;  // four pieces, the last one short, an odd length
    unsigned char *host = (unsigned char *)malloc(n), *back = (unsigned char *)malloc(n);
    unsigned char *pinned = nullptr, *pinned_back = nullptr;
    unsigned char *dev = nullptr, *dev2 = nullptr;
    if (cudaMallocHost(&pinned, n) || cudaMallocHost(&pinned_back, n) ||
        cudaMalloc(&dev, n + 64) || cudaMalloc(&dev2, n + 64)) {
        printf("alloc failed\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) host[i] = (unsigned char)(i * 7 + (i >> 13));
    memcpy(pinned, host, n);
    cudaStream_t a, b;
    cudaStreamCreate(&a);
    cudaStreamCreate(&b);

    // pageable, synchronous, at an odd device offset
    cudaError_t e1 = cudaMemcpy(dev + 3, host, n, cudaMemcpyHostToDevice);
    cudaError_t e2 = cudaMemcpy(back, dev + 3, n, cudaMemcpyDeviceToHost);
    int same1 = memcmp(back, host, n) == 0;

    // page-locked, asynchronous on two streams, a kernel in stream order between
    cudaError_t e3 = cudaMemcpyAsync(dev2 + 1, pinned, n, cudaMemcpyHostToDevice, a);
    cudaError_t e4 = cudaMemcpyAsync(dev, pinned, n, cudaMemcpyHostToDevice, b);
    memset(pinned, 0, n);  // allowed once the copies are synchronized: do it after
    cudaStreamSynchronize(a);
    cudaStreamSynchronize(b);
    bump<<<64, 256, 0, a>>>(dev2 + 1, n);
    cudaError_t e5 = cudaMemcpyAsync(pinned_back, dev2 + 1, n, cudaMemcpyDeviceToHost, a);
    cudaError_t e6 = cudaStreamSynchronize(a);
    int bumped = 1;
    for (size_t i = 0; i < n; i++)
        if (pinned_back[i] != (unsigned char)(host[i] + 1)) { bumped = 0; break; }
    cudaMemcpy(back, dev, n, cudaMemcpyDeviceToHost);
    int same2 = memcmp(back, host, n) == 0;
    printf("copies=%s,%s,%s,%s,%s,%s same=%d,%d bumped=%d sum=%llx\n", cudaGetErrorName(e1),
           cudaGetErrorName(e2), cudaGetErrorName(e3), cudaGetErrorName(e4), cudaGetErrorName(e5),
           cudaGetErrorName(e6), same1, same2, bumped, sum(pinned_back, n));
    return 0;
}
