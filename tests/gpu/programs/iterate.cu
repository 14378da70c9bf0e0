// A long-running program for checkpoint/restore and live migration: steps that each depend on
// the last, the two buffers' pointers kept in device memory (a table the kernel follows and a
// kernel swaps), a __device__ step counter, and a ballast buffer written once; progress lines
// while it runs, then hashes of everything, so a lost, repeated or misplaced byte changes them.
//     iterate [steps = 2000] [sleep_us = 1000] [ballast_mib = 64]
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <unistd.h>
#include <cuda_runtime.h>
__device__ unsigned long long steps_done;
__global__ void step(unsigned **tab, int n, unsigned k) {
    const unsigned *a = tab[0];
    unsigned *b = tab[1];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned l = a[(i + n - 1) % n], r = a[(i + 1) % n];
        b[i] = l + 3u * a[i] + r + k;
    }
    if (i == 0) atomicAdd(&steps_done, 1ull);
}
__global__ void swap(unsigned **tab) {
    unsigned *t = tab[0]; tab[0] = tab[1]; tab[1] = t;
}
__global__ void fill(unsigned *p, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = (unsigned)(i * 2246822519u) ^ 0x5bd1e995u;
}
static unsigned long long fnv(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    unsigned long long h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 1099511628211ull; }
    return h;
}
int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 2000, pause = argc > 2 ? atoi(argv[2]) : 1000;
    size_t ballast = (size_t)(argc > 3 ? atoi(argv[3]) : 64) << 20;
    const int n = 4096;
    std::vector<unsigned> h(n);
    for (int i = 0; i < n; ++i) h[i] = i * 2654435761u;
    unsigned *a, *b, **tab, *big = nullptr;
    cudaMalloc(&a, n * sizeof(unsigned));
    cudaMalloc(&b, n * sizeof(unsigned));
    cudaMalloc(&tab, 2 * sizeof(unsigned *));
    unsigned *ht[2] = {a, b};
    cudaMemcpy(tab, ht, sizeof ht, cudaMemcpyHostToDevice);
    cudaMemcpy(a, h.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice);
    size_t words = ballast / sizeof(unsigned);
    if (words) {
        cudaMalloc(&big, ballast);
        fill<<<(unsigned)((words + 255) / 256), 256>>>(big, words);
    }
    for (int s = 0; s < steps; ++s) {
        step<<<(n + 255) / 256, 256>>>(tab, n, (unsigned)s);
        swap<<<1, 1>>>(tab);
        cudaDeviceSynchronize();
        if (s % 100 == 0) { printf("step %d\n", s); fflush(stdout); }
        if (pause) usleep(pause);
    }
    cudaMemcpy(ht, tab, sizeof ht, cudaMemcpyDeviceToHost);
    cudaMemcpy(h.data(), ht[0], n * sizeof(unsigned), cudaMemcpyDeviceToHost);
    unsigned long long done = 0;
    cudaMemcpyFromSymbol(&done, steps_done, sizeof done);
    unsigned long long hb = 0;
    if (words) {
        std::vector<unsigned> hbig(words);
        cudaMemcpy(hbig.data(), big, ballast, cudaMemcpyDeviceToHost);
        hb = fnv(hbig.data(), ballast);
    }
    printf("result steps_done=%llu state=%016llx ballast=%016llx swapped=%d err=%s\n", done,
           fnv(h.data(), n * sizeof(unsigned)), hb, ht[0] == a ? 0 : 1,
           cudaGetErrorName(cudaGetLastError()));
    return 0;
}
