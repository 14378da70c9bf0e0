// Several host threads, each with its own stream (or, built with --default-stream per-thread,
// the per-thread default stream), each filling and checking its own buffer.
#include <cstdio>
#include <thread>
#include <vector>
#include <cuda_runtime.h>
__global__ void fill(int *p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v * 1000 + i;
}
int main(int argc, char **argv) {
    bool own = argc > 1;  // "own": an explicit stream per thread; else the default stream
    const int nthreads = 4, n = 300;
    std::vector<int> ok(nthreads, 0);
    std::vector<std::thread> ts;
    for (int t = 0; t < nthreads; t++)
        ts.emplace_back([&, t] {
            cudaStream_t s = 0;
            if (own) cudaStreamCreate(&s);
            int *d, h[n];
            cudaMalloc(&d, n * sizeof(int));
            for (int rep = 0; rep < 3; rep++) {
                fill<<<(n + 127) / 128, 128, 0, s>>>(d, n, t + rep);
                cudaMemcpyAsync(h, d, n * sizeof(int), cudaMemcpyDeviceToHost, s);
                cudaStreamSynchronize(s);
                int good = 1;
                for (int i = 0; i < n; i++) good &= h[i] == (t + rep) * 1000 + i;
                ok[t] += good;
            }
            cudaFree(d);
            if (own) cudaStreamDestroy(s);
        });
    for (auto &th : ts) th.join();
    printf("threads=%d ok=%d,%d,%d,%d err=%s\n", nthreads, ok[0], ok[1], ok[2], ok[3],
           cudaGetErrorName(cudaGetLastError()));
    return 0;
}
