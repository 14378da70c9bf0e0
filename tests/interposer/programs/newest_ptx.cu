// Built the way NVIDIA's libraries ship: SASS for a real GPU (sm_90) and PTX only for the
// newest target (compute_120). A real-model simulated device picks the SASS, which it cannot
// run; sim:ptx-next (compute 13.0) JIT-runs the PTX.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void axpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

int main() {
    const int n = 1000;
    float hx[n], hy[n];
    for (int i = 0; i < n; i++) hx[i] = (float)i, hy[i] = 1.f;
    float *x, *y;
    cudaMalloc(&x, sizeof hx);
    cudaMalloc(&y, sizeof hy);
    cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice);
    cudaMemcpy(y, hy, sizeof hy, cudaMemcpyHostToDevice);
    axpy<<<4, 256>>>(2.f, x, y, n);
    cudaError_t launch = cudaGetLastError();
    cudaMemcpy(hy, y, sizeof hy, cudaMemcpyDeviceToHost);
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    printf("cc=%d.%d launch=%s y[999]=%g\n", p.major, p.minor, cudaGetErrorName(launch),
           hy[n - 1]);
    return launch != cudaSuccess;
}
