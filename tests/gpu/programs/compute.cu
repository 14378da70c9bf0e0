// Compute-heavy and deterministic: repeated tiled float matrix products (shared memory, FMA)
// feeding an integer mixing pass; prints a hash of every output bit, so native and Crane runs on
// the same GPU with the same code must agree bit for bit (no float atomics, no transcendentals).
//     compute [n (multiple of 16) = 1024] [reps = 8] [rounds = 2000]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>
#define TILE 16
__global__ void matmul(const float *A, const float *B, float *C, int n, float scale) {
    __shared__ float As[TILE][TILE], Bs[TILE][TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int r = blockIdx.y * TILE + ty, c = blockIdx.x * TILE + tx;
    float acc = 0.f;
    for (int t = 0; t < n; t += TILE) {
        As[ty][tx] = A[r * n + t + tx];
        Bs[ty][tx] = B[(t + ty) * n + c];
        __syncthreads();
        for (int k = 0; k < TILE; k++) acc = fmaf(As[ty][k], Bs[k][tx], acc);
        __syncthreads();
    }
    C[r * n + c] = acc * scale;
}
__global__ void mix(const float *C, unsigned *H, int count, int rounds) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    unsigned x = __float_as_uint(C[i]) ^ (unsigned)i * 2654435761u;
    for (int k = 0; k < rounds; k++) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5; x += 0x9e3779b9u + (unsigned)k;
    }
    H[i] = x;
}
static unsigned long long fnv(const void *p, size_t n, unsigned long long h) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 1099511628211ull; }
    return h;
}
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1024, reps = argc > 2 ? atoi(argv[2]) : 8;
    int rounds = argc > 3 ? atoi(argv[3]) : 2000;
    if (n <= 0 || n % TILE) { printf("n must be a positive multiple of %d\n", TILE); return 2; }
    size_t count = (size_t)n * n, bytes = count * sizeof(float);
    std::vector<float> hA(count), hB(count), hC(count);
    std::vector<unsigned> hH(count);
    unsigned s = 12345u;
    for (size_t i = 0; i < count; i++) {
        s = s * 1664525u + 1013904223u; hA[i] = (float)(int)(s >> 9) / 4194304.0f - 1.0f;
        s = s * 1664525u + 1013904223u; hB[i] = (float)(int)(s >> 9) / 4194304.0f - 1.0f;
    }
    float *A, *B, *C; unsigned *H;
    cudaMalloc(&A, bytes); cudaMalloc(&B, bytes); cudaMalloc(&C, bytes);
    cudaMalloc(&H, count * sizeof(unsigned));
    cudaMemcpy(A, hA.data(), bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(B, hB.data(), bytes, cudaMemcpyHostToDevice);
    dim3 grid(n / TILE, n / TILE), block(TILE, TILE);
    float scale = 1.0f / 32.0f;
    for (int r = 0; r < reps; r++) {
        matmul<<<grid, block>>>(A, B, C, n, scale);
        float *t = A; A = C; C = t;  // the product feeds the next one
    }
    mix<<<(unsigned)((count + 255) / 256), 256>>>(A, H, (int)count, rounds);
    cudaError_t e = cudaDeviceSynchronize();
    cudaMemcpy(hC.data(), A, bytes, cudaMemcpyDeviceToHost);
    cudaMemcpy(hH.data(), H, count * sizeof(unsigned), cudaMemcpyDeviceToHost);
    unsigned long long hc = fnv(hC.data(), bytes, 1469598103934665603ull);
    unsigned long long hh = fnv(hH.data(), count * sizeof(unsigned), 1469598103934665603ull);
    printf("n=%d reps=%d rounds=%d sync=%s\n", n, reps, rounds, cudaGetErrorName(e));
    printf("C[0]=%.9g C[last]=%.9g hashC=%016llx hashH=%016llx\n", hC[0], hC[count - 1], hc, hh);
    printf("last=%s\n", cudaGetErrorName(cudaGetLastError()));
    cudaFree(A); cudaFree(B); cudaFree(C); cudaFree(H);
    return e != cudaSuccess;
}
