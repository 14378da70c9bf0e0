// A small tensor-core GEMM in the style of cuda-samples' cudaTensorCoreGemm, through the
// runtime API: D = alpha * A B + beta * C with A (M x K, row-major half), B (K x N,
// column-major half), C and D (M x N, row-major float). Each block of four warps stages a
// 32x32 tile's A and B slices in shared memory; each warp accumulates a 16x16 tile with
// wmma::mma_sync over K and applies the epilogue on the fragment. Checked exactly against the
// host: f16 products are exact in f32 and each mma adds its 16 products in k order onto the
// accumulator, the order the host loop uses.
#include <cstdio>
#include <cstdlib>
#include <cuda_fp16.h>
#include <mma.h>
#include <vector>

#include "check.h"

using namespace nvcuda;

constexpr int M = 64, N = 96, K = 128, TILE = 32;

__global__ void gemm(const half* a, const half* b, const float* c, float* d, float alpha,
                     float beta) {
    __shared__ __align__(32) half sa[TILE * 16];  // 32 rows of A, 16 of K (row-major)
    __shared__ __align__(32) half sb[TILE * 16];  // 32 columns of B, 16 of K (column-major)
    int warp = threadIdx.x / 32, row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
    int wr = (warp / 2) * 16, wc = (warp % 2) * 16;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc, fc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k0 = 0; k0 < K; k0 += 16) {
        for (int i = threadIdx.x; i < TILE * 16; i += blockDim.x) {
            int r = i / 16, kk = i % 16;
            sa[i] = a[(row0 + r) * K + k0 + kk];
            sb[i] = b[(col0 + r) * K + k0 + kk];
        }
        __syncthreads();
        wmma::load_matrix_sync(fa, sa + wr * 16, 16);
        wmma::load_matrix_sync(fb, sb + wc * 16, 16);
        wmma::mma_sync(acc, fa, fb, acc);
        __syncthreads();
    }
    const float* ct = c + (row0 + wr) * N + col0 + wc;
    wmma::load_matrix_sync(fc, ct, N, wmma::mem_row_major);
    // explicit roundings: nvcc would contract this into an fma, which the host does not do
    for (int i = 0; i < acc.num_elements; i++)
        acc.x[i] = __fadd_rn(__fmul_rn(alpha, acc.x[i]), __fmul_rn(beta, fc.x[i]));
    wmma::store_matrix_sync(d + (row0 + wr) * N + col0 + wc, acc, N, wmma::mem_row_major);
}

int main() {
    std::vector<half> ha(M * K), hb(N * K);
    std::vector<float> fa(M * K), fb(N * K), hc(M * N), hd(M * N);
    srand(7);
    for (int i = 0; i < M * K; i++) {
        ha[i] = __float2half((rand() % 2001 - 1000) / 512.0f);
        fa[i] = __half2float(ha[i]);
    }
    for (int i = 0; i < N * K; i++) {
        hb[i] = __float2half((rand() % 2001 - 1000) / 512.0f);
        fb[i] = __half2float(hb[i]);
    }
    for (int i = 0; i < M * N; i++) hc[i] = (rand() % 2001 - 1000) / 64.0f;
    half *da, *db;
    float *dc, *dd;
    CHECK(cudaMalloc(&da, M * K * sizeof(half)) == cudaSuccess, "malloc");
    CHECK(cudaMalloc(&db, N * K * sizeof(half)) == cudaSuccess, "malloc");
    CHECK(cudaMalloc(&dc, M * N * sizeof(float)) == cudaSuccess, "malloc");
    CHECK(cudaMalloc(&dd, M * N * sizeof(float)) == cudaSuccess, "malloc");
    cudaMemcpy(da, ha.data(), M * K * sizeof(half), cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb.data(), N * K * sizeof(half), cudaMemcpyHostToDevice);
    cudaMemcpy(dc, hc.data(), M * N * sizeof(float), cudaMemcpyHostToDevice);
    const float alpha = 1.5f, beta = -0.5f;
    gemm<<<dim3(N / TILE, M / TILE), 128>>>(da, db, dc, dd, alpha, beta);
    cudaError_t err = cudaDeviceSynchronize();
    CHECK(err == cudaSuccess, "launch: %s", cudaGetErrorString(err));
    cudaMemcpy(hd.data(), dd, M * N * sizeof(float), cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) {
                volatile float p = fa[i * K + k] * fb[j * K + k];
                acc = acc + p;
            }
            volatile float s1 = alpha * acc, s2 = beta * hc[i * N + j];
            float want = s1 + s2;
            if (hd[i * N + j] != want && bad++ < 5)
                printf("D[%d][%d] = %g, want %g\n", i, j, hd[i * N + j], want);
        }
    CHECK(bad == 0, "%d elements differ", bad);
    printf("gemm %dx%dx%d checked\n", M, N, K);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    cudaFree(dd);
    return finish();
}
