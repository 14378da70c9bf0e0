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

// A framework's index check: gather with every index checked (assert), one thread per output.
extern "C" __global__ void gather_checked(const long long* ix, const float* src, float* dst,
                                          int n, int m) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        long long j = ix[i];
        assert(j >= 0 && j < m);
        dst[i] = src[j];
    }
}

// The same check in a 2-D grid of 2-D blocks, after a barrier (regions, the general driver).
extern "C" __global__ void assert_2d(const int* p, int* out, int limit) {
    __shared__ int row[32];
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    int w = gridDim.x * blockDim.x;
    if (threadIdx.y == 0) row[threadIdx.x] = threadIdx.x;
    __syncthreads();
    int v = p[y * w + x];
    assert(v < limit);
    out[y * w + x] = v + row[threadIdx.x];
}

// The check inside a grid-stride loop after a barrier: which thread fails first depends on
// the schedule (lanes in lockstep, or one after another).
extern "C" __global__ void assert_in_loop(const int* p, int* out, int n, int limit) {
    __shared__ int s[256];
    s[threadIdx.x] = threadIdx.x;
    __syncthreads();
    int acc = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        int v = p[i];
        assert(v < limit);
        acc += v + s[(threadIdx.x + 1) % blockDim.x];
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
