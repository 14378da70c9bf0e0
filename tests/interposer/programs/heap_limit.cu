// cudaDeviceSetLimit(cudaLimitMallocHeapSize) before the first kernel sizes the device heap:
// 24 MiB fits in a 32 MiB heap (not in the default 8 MiB), 40 MiB does not.
#include <cstdio>

__global__ void try_alloc(unsigned long long bytes, unsigned long long* got) {
    void* p = malloc(bytes);
    *got = p != nullptr;
    if (p) {
        ((char*)p)[bytes - 1] = 1;  // the whole block is usable memory
        free(p);
    }
}

int main() {
    cudaError_t set = cudaDeviceSetLimit(cudaLimitMallocHeapSize, 32u << 20);
    size_t heap = 0;
    cudaDeviceGetLimit(&heap, cudaLimitMallocHeapSize);
    unsigned long long *d, h[2];
    cudaMalloc(&d, 2 * sizeof *d);
    try_alloc<<<1, 1>>>(24ull << 20, d);
    try_alloc<<<1, 1>>>(40ull << 20, d + 1);
    cudaError_t e = cudaDeviceSynchronize();
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    printf("set=%s heap=%zu sync=%s 24MiB=%llu 40MiB=%llu\n", cudaGetErrorString(set), heap,
           cudaGetErrorString(e), h[0], h[1]);
    return 0;
}
