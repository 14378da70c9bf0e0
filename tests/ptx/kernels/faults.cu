#include <cassert>
// Kernels that must fail the launch.
extern "C" __global__ void oob_write(int* p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    p[i + n] = i;   // runs off the end for every thread
}

extern "C" __global__ void oob_read(const float* p, float* out, long long off) {
    out[threadIdx.x] = p[off + threadIdx.x];
}

extern "C" __global__ void null_write(int* p) {
    if (threadIdx.x == 3) *(volatile int*)0 = 1;
    p[threadIdx.x] = 1;
}

extern "C" __global__ void misaligned(const char* p, int* out) {
    out[threadIdx.x] = *(const int*)(p + 1);
}

extern "C" __global__ void do_trap(int* p, int when) {
    p[threadIdx.x] = 1;
    if (threadIdx.x == when) __trap();
}

extern "C" __global__ void do_assert(const int* p, int limit) {
    int v = p[threadIdx.x];
    assert(v < limit);
}

extern "C" __global__ void shared_oob(int* out, int k) {
    __shared__ int s[64];
    s[threadIdx.x] = threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x + k];
}
