// Clocks that follow wall time, FP8 conversions and an mbarrier-backed memcpy_async, through
// the runtime API on the simulated GPU. Prints one line per check; the test reads them.
#include <chrono>
#include <cooperative_groups.h>
#include <cstdio>
#include <cuda/barrier>
#include <cuda_fp8.h>

namespace cg = cooperative_groups;

__global__ void spin(long long cycles, unsigned long long *out) {
    unsigned long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
    unsigned long long t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    out[0] = (unsigned long long)(clock64() - start);
    out[1] = t1 - t0;
}

__global__ void to_fp8(const float2 *in, unsigned short *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[2 * i] = __nv_cvt_float2_to_fp8x2(in[i], __NV_SATFINITE, __NV_E4M3);
        out[2 * i + 1] = __nv_cvt_float2_to_fp8x2(in[i], __NV_SATFINITE, __NV_E5M2);
    }
}

__global__ void tile_sum(const float *in, float *out) {
    __shared__ alignas(16) float tile[256];
    __shared__ cuda::barrier<cuda::thread_scope_block> bar;
    auto block = cg::this_thread_block();
    if (block.thread_rank() == 0) init(&bar, block.size());
    block.sync();
    cuda::memcpy_async(block, tile, in + blockIdx.x * 256, cuda::aligned_size_t<16>(1024), bar);
    bar.arrive_and_wait();
    out[blockIdx.x * 256 + block.thread_rank()] = tile[255 - block.thread_rank()] * 2.f;
}

int main() {
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    unsigned long long *d_out, h_out[2];
    cudaMalloc(&d_out, sizeof(h_out));
    long long cycles = (long long)khz * 100;  // 0.1 s of the SM clock
    auto t0 = std::chrono::steady_clock::now();
    spin<<<1, 1>>>(cycles, d_out);
    cudaError_t e = cudaDeviceSynchronize();
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cudaMemcpy(h_out, d_out, sizeof(h_out), cudaMemcpyDeviceToHost);
    printf("spin %s cycles_ok=%d wall_ok=%d timer_ok=%d\n", cudaGetErrorName(e),
           h_out[0] >= (unsigned long long)cycles, wall > 0.09 && wall < 5.0,
           h_out[1] > 90000000ULL && h_out[1] < 5000000000ULL);

    const int n = 4096;
    float2 *h_in = new float2[n];
    for (int i = 0; i < n; i++) {
        unsigned u = 2654435761u * (unsigned)i, v = 40503u * (unsigned)i + 12345u;
        float a = ((int)(u % 20001) - 10000) * 0.0625f, b = ((int)(v % 2001) - 1000) / 7.0f;
        h_in[i] = make_float2(a * (i % 3 ? 1.0f : 100.0f), b);
    }
    float2 *d_in;
    unsigned short *d_f8, *h_f8 = new unsigned short[2 * n];
    cudaMalloc(&d_in, n * sizeof(float2));
    cudaMalloc(&d_f8, 2 * n * sizeof(unsigned short));
    cudaMemcpy(d_in, h_in, n * sizeof(float2), cudaMemcpyHostToDevice);
    to_fp8<<<(n + 127) / 128, 128>>>(d_in, d_f8, n);
    e = cudaMemcpy(h_f8, d_f8, 2 * n * sizeof(unsigned short), cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        bad += h_f8[2 * i] != __nv_cvt_float2_to_fp8x2(h_in[i], __NV_SATFINITE, __NV_E4M3);
        bad += h_f8[2 * i + 1] != __nv_cvt_float2_to_fp8x2(h_in[i], __NV_SATFINITE, __NV_E5M2);
    }
    printf("fp8 %s mismatches=%d\n", cudaGetErrorName(e), bad);

    const int blocks = 4;
    float *h_t = new float[blocks * 256], *h_r = new float[blocks * 256], *d_t, *d_r;
    for (int i = 0; i < blocks * 256; i++) h_t[i] = (float)(i % 97) - 30.f;
    cudaMalloc(&d_t, blocks * 256 * sizeof(float));
    cudaMalloc(&d_r, blocks * 256 * sizeof(float));
    cudaMemcpy(d_t, h_t, blocks * 256 * sizeof(float), cudaMemcpyHostToDevice);
    tile_sum<<<blocks, 256>>>(d_t, d_r);
    e = cudaMemcpy(h_r, d_r, blocks * 256 * sizeof(float), cudaMemcpyDeviceToHost);
    bad = 0;
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < 256; t++) bad += h_r[b * 256 + t] != 2.f * h_t[b * 256 + 255 - t];
    printf("memcpy_async %s mismatches=%d\n", cudaGetErrorName(e), bad);
    return 0;
}
