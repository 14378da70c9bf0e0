#include <cstdio>
#include <cuda_runtime.h>
__global__ void vadd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
int main() {
    const int n = 1000;
    float ha[n], hb[n], hc[n];
    for (int i = 0; i < n; i++) { ha[i] = i; hb[i] = 2 * i; }
    float *da, *db, *dc;
    cudaMalloc(&da, n * sizeof(float)); cudaMalloc(&db, n * sizeof(float)); cudaMalloc(&dc, n * sizeof(float));
    cudaMemcpy(da, ha, n * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb, n * sizeof(float), cudaMemcpyHostToDevice);
    vadd<<<(n + 255) / 256, 256>>>(da, db, dc, n);
    cudaError_t e = cudaDeviceSynchronize();
    cudaMemcpy(hc, dc, n * sizeof(float), cudaMemcpyDeviceToHost);
    double sum = 0; for (int i = 0; i < n; i++) sum += hc[i];
    printf("sync=%s sum=%.1f c[999]=%.1f\n", cudaGetErrorName(e), sum, hc[999]);
    cudaFree(da); cudaFree(db); cudaFree(dc);
    return 0;
}
