// cuBLAS as a guest: handle creation, SGEMM and GemmEx (FP32, and FP16 inputs with FP32
// compute), each result checked against a CPU product. Host code only: the kernels are cuBLAS's.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include "check.h"

// Column-major C = alpha * A(m x k) * B(k x n) + beta * C, in double.
static std::vector<double> gemm_ref(int m, int n, int k, double alpha, const std::vector<float> &a,
                                    const std::vector<float> &b, double beta,
                                    const std::vector<float> &c) {
    std::vector<double> out(size_t(m) * n);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int p = 0; p < k; p++) s += double(a[i + size_t(p) * m]) * b[p + size_t(j) * k];
            out[i + size_t(j) * m] = alpha * s + beta * c[i + size_t(j) * m];
        }
    return out;
}

static double max_rel_err(const std::vector<float> &got, const std::vector<double> &want) {
    double worst = 0;
    for (size_t i = 0; i < got.size(); i++)
        worst = fmax(worst, fabs(got[i] - want[i]) / fmax(1.0, fabs(want[i])));
    return worst;
}

// Values exactly representable in FP16 (multiples of 1/4 in [-4, 4)), so that the FP16 product
// is checked against the same reference as the FP32 one.
static std::vector<float> quarters(size_t n, unsigned seed) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        v[i] = float(int((seed >> 16) % 32) - 16) / 4.0f;
    }
    return v;
}

template <class T> static T *upload(const std::vector<T> &h) {
    T *d = nullptr;
    CHECK(cudaMalloc(&d, h.size() * sizeof(T)) == cudaSuccess, "cudaMalloc");
    CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess,
          "upload");
    return d;
}

static std::vector<float> download(const float *d, size_t n) {
    std::vector<float> h(n);
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess,
          "download");
    return h;
}

int main() {
    int rt = 0;
    cudaRuntimeGetVersion(&rt);
    cublasHandle_t h;
    cublasStatus_t st = cublasCreate(&h);
    int ver = 0;
    if (st == CUBLAS_STATUS_SUCCESS) cublasGetVersion(h, &ver);
    printf("runtime=%d cublas=%d create=%d\n", rt, ver, int(st));
    if (st != CUBLAS_STATUS_SUCCESS) return 1;

    const int m = 48, n = 40, k = 32;
    std::vector<float> a = quarters(size_t(m) * k, 1), b = quarters(size_t(k) * n, 2),
                       c = quarters(size_t(m) * n, 3);
    float *da = upload(a), *db = upload(b), *dc = upload(c);

    // SGEMM: C = 1.5 A B - 0.5 C
    float alpha = 1.5f, beta = -0.5f;
    st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, da, m, db, k, &beta, dc, m);
    CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasSgemm status %d", int(st));
    double err = max_rel_err(download(dc, c.size()), gemm_ref(m, n, k, alpha, a, b, beta, c));
    CHECK(err < 1e-5, "sgemm max relative error %g", err);
    printf("sgemm status=%d err_ok=%d\n", int(st), err < 1e-5);

    // GemmEx, FP32 in and out, FP32 compute: C = A B
    float one = 1.0f, zero = 0.0f;
    st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, CUDA_R_32F, m, db,
                      CUDA_R_32F, k, &zero, dc, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
    CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasGemmEx fp32 status %d", int(st));
    std::vector<double> ab = gemm_ref(m, n, k, 1.0, a, b, 0.0, c);
    err = max_rel_err(download(dc, c.size()), ab);
    CHECK(err < 1e-5, "gemmex fp32 max relative error %g", err);
    printf("gemmex_f32 status=%d err_ok=%d\n", int(st), err < 1e-5);

    // GemmEx, FP16 A and B, FP32 C and compute: the same product, exact in FP32 here.
    std::vector<__half> ah(a.size()), bh(b.size());
    for (size_t i = 0; i < a.size(); i++) ah[i] = __float2half(a[i]);
    for (size_t i = 0; i < b.size(); i++) bh[i] = __float2half(b[i]);
    __half *dah = upload(ah), *dbh = upload(bh);
    CHECK(cudaMemset(dc, 0, c.size() * sizeof(float)) == cudaSuccess, "memset");
    st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dah, CUDA_R_16F, m, dbh,
                      CUDA_R_16F, k, &zero, dc, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
    CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasGemmEx fp16 status %d", int(st));
    err = max_rel_err(download(dc, c.size()), ab);
    CHECK(err < 1e-5, "gemmex fp16 max relative error %g", err);
    printf("gemmex_f16 status=%d err_ok=%d\n", int(st), err < 1e-5);

    // A transposed operand: C = A^T B with A stored k x m.
    std::vector<float> at(a.size());
    for (int i = 0; i < m; i++)
        for (int p = 0; p < k; p++) at[p + size_t(i) * k] = a[i + size_t(p) * m];
    float *dat = upload(at);
    st = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, dat, k, db, k, &zero, dc, m);
    CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasSgemm T status %d", int(st));
    err = max_rel_err(download(dc, c.size()), ab);
    CHECK(err < 1e-5, "sgemm T max relative error %g", err);
    printf("sgemm_t status=%d err_ok=%d\n", int(st), err < 1e-5);

    // DGEMM of the same product, and a dot product (its launch sizing divides by the registers
    // a kernel reports: 0 there was a SIGFPE)
    std::vector<double> a64(a.begin(), a.end()), b64(b.begin(), b.end());
    double *da64 = upload(a64), *db64 = upload(b64), *dc64 = nullptr;
    CHECK(cudaMalloc(&dc64, c.size() * sizeof(double)) == cudaSuccess, "cudaMalloc");
    double done = 1, dzero = 0;
    st = cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &done, da64, m, db64, k, &dzero, dc64, m);
    CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasDgemm status %d", int(st));
    cublasStatus_t dgemm_st = st;
    std::vector<double> c64(c.size());
    CHECK(cudaMemcpy(c64.data(), dc64, c64.size() * sizeof(double), cudaMemcpyDeviceToHost) ==
              cudaSuccess,
          "download");
    int dgemm_exact = c64 == ab;
    CHECK(dgemm_exact, "dgemm differs");
    float dot = 0;
    st = cublasSdot(h, int(a.size()), da, 1, da, 1, &dot);
    double want = 0;
    for (float v : a) want += double(v) * v;
    CHECK(st == CUBLAS_STATUS_SUCCESS && dot == want, "sdot status %d: %g, want %g", int(st), dot,
          want);
    printf("dgemm status=%d exact=%d sdot status=%d exact=%d\n", int(dgemm_st), dgemm_exact,
           int(st), dot == want);
    cudaFree(da64); cudaFree(db64); cudaFree(dc64);

    // Triangular solve L x = b (unit lower, 40 rows: cuBLAS runs it as blocks that wait for
    // the block before them), checked against forward substitution
    const int t = 40;
    std::vector<float> l(size_t(t) * t, 0.0f), rhs = quarters(t, 5);
    for (int i = 0; i < t; i++)
        for (int j = 0; j < i; j++) l[i + size_t(j) * t] = float((i + j) % 5 - 2) / 16;
    std::vector<double> sol(t);
    for (int i = 0; i < t; i++) {
        double v = rhs[i];
        for (int j = 0; j < i; j++) v -= l[i + size_t(j) * t] * sol[j];
        sol[i] = v;
    }
    float *dl = upload(l), *dxs = upload(rhs);
    st = cublasStrsm(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, CUBLAS_DIAG_UNIT, t,
                     1, &one, dl, t, dxs, t);
    CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasStrsm status %d", int(st));
    err = max_rel_err(download(dxs, t), sol);
    CHECK(err < 1e-4, "strsm max relative error %g", err);
    printf("strsm status=%d err_ok=%d\n", int(st), err < 1e-4);
    cudaFree(dl); cudaFree(dxs);

    // On a stream of its own (cuBLAS keeps state per stream, keyed through the driver)
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream) == cudaSuccess, "cudaStreamCreate");
    CHECK(cublasSetStream(h, stream) == CUBLAS_STATUS_SUCCESS, "cublasSetStream");
    CHECK(cudaMemset(dc, 0, c.size() * sizeof(float)) == cudaSuccess, "memset");
    st = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, m, db, k, &zero, dc, m);
    CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasSgemm on a stream: status %d", int(st));
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "cudaStreamSynchronize");
    err = max_rel_err(download(dc, c.size()), ab);
    CHECK(err < 1e-5, "sgemm on a stream max relative error %g", err);
    printf("sgemm_stream status=%d err_ok=%d\n", int(st), err < 1e-5);
    cublasSetStream(h, 0);
    cudaStreamDestroy(stream);

    cudaFree(da); cudaFree(db); cudaFree(dc); cudaFree(dah); cudaFree(dbh); cudaFree(dat);
    st = cublasDestroy(h);
    CHECK(st == CUBLAS_STATUS_SUCCESS, "cublasDestroy status %d", int(st));
    printf("destroy status=%d\n", int(st));
    return finish();
}
