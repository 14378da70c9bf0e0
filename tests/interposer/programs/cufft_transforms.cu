// cuFFT as a guest: 1D complex-to-complex (forward and inverse), 1D real-to-complex and 2D
// complex-to-complex plans, executed and compared with a naive DFT computed on the CPU. Host
// code only: the kernels are cuFFT's.
#include <cmath>
#include <complex>
#include <cstdio>
#include <vector>
#include <cuda_runtime.h>
#include <cufft.h>
#include "check.h"

typedef std::complex<double> cd;

// Naive DFT over a rows x cols array (rows == 1 for 1D), sign -1 forward, +1 inverse
// (unnormalized, as cuFFT computes it).
static std::vector<cd> dft(const std::vector<cd> &in, int rows, int cols, int sign) {
    std::vector<cd> out(in.size());
    for (int u = 0; u < rows; u++)
        for (int v = 0; v < cols; v++) {
            cd s = 0;
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < cols; c++) {
                    double ang = sign * 2 * M_PI * (double(u) * r / rows + double(v) * c / cols);
                    s += in[size_t(r) * cols + c] * cd(cos(ang), sin(ang));
                }
            out[size_t(u) * cols + v] = s;
        }
    return out;
}

static std::vector<cd> signal(size_t n, unsigned seed) {
    std::vector<cd> v(n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        double re = double((seed >> 16) % 2001) / 1000.0 - 1.0;
        seed = seed * 1103515245u + 12345u;
        double im = double((seed >> 16) % 2001) / 1000.0 - 1.0;
        v[i] = cd(re, im);
    }
    return v;
}

// Largest |got - want| relative to the largest |want|.
static double rel_err(const std::vector<cufftComplex> &got, const std::vector<cd> &want) {
    double worst = 0, scale = 1e-30;
    for (size_t i = 0; i < want.size(); i++) {
        worst = fmax(worst, std::abs(cd(got[i].x, got[i].y) - want[i]));
        scale = fmax(scale, std::abs(want[i]));
    }
    return worst / scale;
}

static cufftComplex *upload(const std::vector<cd> &h) {
    std::vector<cufftComplex> f(h.size());
    for (size_t i = 0; i < h.size(); i++) f[i] = {float(h[i].real()), float(h[i].imag())};
    cufftComplex *d = nullptr;
    CHECK(cudaMalloc(&d, f.size() * sizeof(cufftComplex)) == cudaSuccess, "cudaMalloc");
    CHECK(cudaMemcpy(d, f.data(), f.size() * sizeof(cufftComplex), cudaMemcpyHostToDevice) ==
              cudaSuccess,
          "upload");
    return d;
}

static std::vector<cufftComplex> download(const cufftComplex *d, size_t n) {
    std::vector<cufftComplex> h(n);
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(cufftComplex), cudaMemcpyDeviceToHost) ==
              cudaSuccess,
          "download");
    return h;
}

static const double TOL = 1e-4;

int main() {
    int ver = 0;
    cufftGetVersion(&ver);
    printf("cufft=%d\n", ver);

    // 1D C2C, n = 64: forward, then inverse of the result (n times the input).
    const int n = 64;
    std::vector<cd> x = signal(n, 7);
    cufftComplex *dx = upload(x);
    cufftHandle p1;
    cufftResult r = cufftPlan1d(&p1, n, CUFFT_C2C, 1);
    CHECK(r == CUFFT_SUCCESS, "cufftPlan1d C2C: %d", int(r));
    r = cufftExecC2C(p1, dx, dx, CUFFT_FORWARD);
    CHECK(r == CUFFT_SUCCESS, "cufftExecC2C forward: %d", int(r));
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "sync");
    std::vector<cd> fx = dft(x, 1, n, -1);
    double e = rel_err(download(dx, n), fx);
    CHECK(e < TOL, "1d c2c forward error %g", e);
    printf("c2c_1d plan=%d forward_ok=%d\n", int(r), e < TOL);
    r = cufftExecC2C(p1, dx, dx, CUFFT_INVERSE);
    CHECK(r == CUFFT_SUCCESS, "cufftExecC2C inverse: %d", int(r));
    std::vector<cd> nx(x);
    for (cd &v : nx) v *= n;
    e = rel_err(download(dx, n), nx);
    CHECK(e < TOL, "1d c2c inverse error %g", e);
    printf("c2c_1d inverse_ok=%d\n", e < TOL);
    cufftDestroy(p1);

    // 1D R2C, n = 48: n/2 + 1 outputs, the non-redundant half of the DFT of a real signal.
    const int m = 48;
    std::vector<cd> xr = signal(m, 11);
    std::vector<float> xf(m);
    for (int i = 0; i < m; i++) {
        xf[i] = float(xr[i].real());
        xr[i] = cd(xf[i], 0);
    }
    float *dr = nullptr;
    cufftComplex *dro = nullptr;
    CHECK(cudaMalloc(&dr, m * sizeof(float)) == cudaSuccess, "cudaMalloc");
    CHECK(cudaMalloc(&dro, (m / 2 + 1) * sizeof(cufftComplex)) == cudaSuccess, "cudaMalloc");
    CHECK(cudaMemcpy(dr, xf.data(), m * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess,
          "upload");
    cufftHandle p2;
    r = cufftPlan1d(&p2, m, CUFFT_R2C, 1);
    CHECK(r == CUFFT_SUCCESS, "cufftPlan1d R2C: %d", int(r));
    r = cufftExecR2C(p2, dr, dro);
    CHECK(r == CUFFT_SUCCESS, "cufftExecR2C: %d", int(r));
    std::vector<cd> fr = dft(xr, 1, m, -1);
    fr.resize(m / 2 + 1);
    e = rel_err(download(dro, m / 2 + 1), fr);
    CHECK(e < TOL, "1d r2c error %g", e);
    printf("r2c_1d exec=%d ok=%d\n", int(r), e < TOL);
    cufftDestroy(p2);

    // 2D C2C, 16 x 12, forward, out of place.
    const int rows = 16, cols = 12;
    std::vector<cd> y = signal(size_t(rows) * cols, 13);
    cufftComplex *dy = upload(y), *dyo = nullptr;
    CHECK(cudaMalloc(&dyo, y.size() * sizeof(cufftComplex)) == cudaSuccess, "cudaMalloc");
    cufftHandle p3;
    r = cufftPlan2d(&p3, rows, cols, CUFFT_C2C);
    CHECK(r == CUFFT_SUCCESS, "cufftPlan2d: %d", int(r));
    r = cufftExecC2C(p3, dy, dyo, CUFFT_FORWARD);
    CHECK(r == CUFFT_SUCCESS, "cufftExecC2C 2d: %d", int(r));
    e = rel_err(download(dyo, y.size()), dft(y, rows, cols, -1));
    CHECK(e < TOL, "2d c2c error %g", e);
    printf("c2c_2d exec=%d ok=%d\n", int(r), e < TOL);
    cufftDestroy(p3);

    cudaFree(dx); cudaFree(dr); cudaFree(dro); cudaFree(dy); cudaFree(dyo);
    return finish();
}
