#include <cstdio>
// Device printf with the common conversions.
extern "C" __global__ void hello(int a, float b, const char* label) {
    printf("thread %d block %d: a=%d b=%f\n", threadIdx.x, blockIdx.x, a, b);
    if (threadIdx.x == 0) {
        printf("[%5d|%-5d|%05d|%+d|%x|%X|%#x|%o|%c|%u]\n", a, a, a, a, 255, 255, 255, 8, 'Z', -1);
        printf("%.3f %e %.2e %g %g %10.4f|%-8.2f|\n", b, b, 12345.678, 0.0001, 1e20, b, b);
        printf("%s and %s %ld %lld %lu %llu %i\n", "literal", label, -5L, -6LL, 7UL, 8ULL, -9);
        printf("%%done %5.1s|%-4s|\n", "xyz", "ab");
        printf("%p %.0f %G %E\n", (void*)0x1234, 2.5, 1e-10, 3.0);
        printf("no args\n");
    }
}

// A few threads of a large grid print (every core's blocks).
extern "C" __global__ void sparse_print(const float* v, int n, int every) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && i % every == 0) printf("v[%d] = %.3f\n", i, v[i]);
}

// printf in a loop after a barrier, in 2-D blocks; its return value is used.
extern "C" __global__ void loop_print(int* out, int rounds) {
    __shared__ int s[64];
    int nt = blockDim.x * blockDim.y;
    int t = threadIdx.y * blockDim.x + threadIdx.x;
    s[t] = t * 10;
    __syncthreads();
    int acc = 0;
    for (int r = 0; r < rounds; r++) {
        acc += printf("b%d t%d r%d s=%d\n", blockIdx.x, t, r, s[(t + r) % nt]);
    }
    out[blockIdx.x * nt + t] = acc;
}

// %s of a global, a shared and a local string; ``skip`` moves the global one (past its end:
// the read faults).
extern "C" __global__ void string_spaces(const char* g, long long skip) {
    __shared__ char sh[8];
    char loc[8];
    for (int k = 0; k < 7; k++) {
        if (threadIdx.x == 0) sh[k] = 'a' + k;
        loc[k] = 'A' + k + threadIdx.x;
    }
    sh[7] = 0;
    loc[7] = 0;
    __syncthreads();
    printf("%s|%s|%s\n", g + skip, sh, loc);
}
