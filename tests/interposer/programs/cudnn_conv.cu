// cuDNN as a guest: a handle and one small convolution forward (NCHW, FP32), checked against a
// direct convolution on the CPU. Host code only: the kernels are cuDNN's.
#include <cmath>
#include <cstdio>
#include <vector>
#include <cuda_runtime.h>
#include <cudnn.h>
#include "check.h"

#define CK(x)                                                                       \
    do {                                                                            \
        cudnnStatus_t s_ = (x);                                                     \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                           \
            printf("FAIL %s: %s\n", #x, cudnnGetErrorString(s_));                   \
            return 1;                                                               \
        }                                                                           \
    } while (0)

int main() {
    printf("cudnn=%zu\n", cudnnGetVersion());
    cudnnHandle_t h;
    CK(cudnnCreate(&h));
    const int n = 1, c = 2, hh = 6, w = 6, k = 3, r = 3, s = 3, pad = 1;
    std::vector<float> x(n * c * hh * w), f(k * c * r * s);
    for (size_t i = 0; i < x.size(); i++) x[i] = float(int(i * 7 % 11) - 5) / 4;
    for (size_t i = 0; i < f.size(); i++) f[i] = float(int(i * 5 % 9) - 4) / 2;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t fd;
    cudnnConvolutionDescriptor_t cd;
    CK(cudnnCreateTensorDescriptor(&xd));
    CK(cudnnCreateTensorDescriptor(&yd));
    CK(cudnnCreateFilterDescriptor(&fd));
    CK(cudnnCreateConvolutionDescriptor(&cd));
    CK(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, hh, w));
    CK(cudnnSetFilter4dDescriptor(fd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, k, c, r, s));
    CK(cudnnSetConvolution2dDescriptor(cd, pad, pad, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                       CUDNN_DATA_FLOAT));
    int on, oc, oh, ow;
    CK(cudnnGetConvolution2dForwardOutputDim(cd, xd, fd, &on, &oc, &oh, &ow));
    CK(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, on, oc, oh, ow));
    std::vector<float> y(size_t(on) * oc * oh * ow);
    float *dx, *df, *dy;
    cudaMalloc(&dx, x.size() * 4);
    cudaMalloc(&df, f.size() * 4);
    cudaMalloc(&dy, y.size() * 4);
    cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(df, f.data(), f.size() * 4, cudaMemcpyHostToDevice);
    cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    size_t ws = 0;
    CK(cudnnGetConvolutionForwardWorkspaceSize(h, xd, fd, cd, yd, algo, &ws));
    void *dws = nullptr;
    if (ws) cudaMalloc(&dws, ws);
    float alpha = 1, beta = 0;
    CK(cudnnConvolutionForward(h, &alpha, xd, dx, fd, df, cd, algo, dws, ws, &beta, yd, dy));
    cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost);
    double worst = 0;
    for (int o = 0; o < k; o++)
        for (int i = 0; i < oh; i++)
            for (int j = 0; j < ow; j++) {
                double acc = 0;
                for (int ch = 0; ch < c; ch++)
                    for (int a = 0; a < r; a++)
                        for (int b = 0; b < s; b++) {
                            int yi = i + a - pad, xj = j + b - pad;
                            if (yi < 0 || yi >= hh || xj < 0 || xj >= w) continue;
                            acc += double(x[(ch * hh + yi) * w + xj]) *
                                   f[((o * c + ch) * r + a) * s + b];
                        }
                worst = fmax(worst, fabs(acc - y[(o * oh + i) * ow + j]));
            }
    CHECK(worst < 1e-4, "convolution max error %g", worst);
    printf("conv out=%dx%dx%dx%d ws=%zu ok=%d\n", on, oc, oh, ow, ws, worst < 1e-4);
    CK(cudnnDestroy(h));
    return finish();
}
