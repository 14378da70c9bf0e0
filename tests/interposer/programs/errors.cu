// Error fidelity: an invalid launch configuration fails at the launch (and is cleared by
// cudaGetLastError, not by cudaPeekAtLastError); an illegal address in a kernel surfaces at the
// next synchronization and is sticky.
#include <cstdio>
#include <cuda_runtime.h>
__global__ void k(int *p) { p[threadIdx.x] = 1; }
int main() {
    int *d;
    cudaMalloc(&d, 256 * sizeof(int));
    k<<<1, 4096>>>(d);
    printf("peek=%s\n", cudaGetErrorName(cudaPeekAtLastError()));
    printf("peek2=%s\n", cudaGetErrorName(cudaPeekAtLastError()));
    printf("last=%s\n", cudaGetErrorName(cudaGetLastError()));
    printf("last2=%s\n", cudaGetErrorName(cudaGetLastError()));
    k<<<1, 32>>>(d);
    printf("good=%s sync=%s\n", cudaGetErrorName(cudaGetLastError()),
           cudaGetErrorName(cudaDeviceSynchronize()));
    k<<<1, 32>>>((int *)0x10);
    printf("launch=%s\n", cudaGetErrorName(cudaGetLastError()));
    printf("sync=%s\n", cudaGetErrorName(cudaDeviceSynchronize()));
    int *e;
    printf("malloc_after=%s\n", cudaGetErrorName(cudaMalloc(&e, 16)));
    printf("sync_again=%s\n", cudaGetErrorName(cudaDeviceSynchronize()));
    return 0;
}
