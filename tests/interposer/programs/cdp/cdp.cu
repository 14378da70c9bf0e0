// Dynamic parallelism (CDP2): fire-and-forget children fill an array, a tail launch sums it
// after them, a kernel launches itself recursively until the nesting limit refuses, and a bad
// configuration is reported by the device-side cudaGetLastError.
#include <cstdio>

__global__ void child(int* out, int base, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[base + i] = base + 2 * i;
}

__global__ void sum_tail(int* result, const int* out, int n) {
    int s = 0;
    for (int i = 0; i < n; ++i) s += out[i];
    *result = s;
}

__global__ void parent(int* out, int* result, int n, int* errs) {
    int b = blockIdx.x;
    if (threadIdx.x == 0) {
        child<<<2, 32, 0, cudaStreamFireAndForget>>>(out, b * 64, 64);
        errs[b] = (int)cudaGetLastError();
        if (b == 0) sum_tail<<<1, 1, 0, cudaStreamTailLaunch>>>(result, out, n);
    }
}

// each level records that it ran and launches the next, until a launch is refused
__global__ void nest(int* reached, int* refused, int level) {
    reached[level] = 1;
    nest<<<1, 1, 0, cudaStreamTailLaunch>>>(reached, refused, level + 1);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) *refused = (int)e * 1000 + level;
}

__global__ void bad_config(int* err) {
    child<<<0, 32>>>(nullptr, 0, 0);
    err[0] = (int)cudaPeekAtLastError();
    err[1] = (int)cudaGetLastError();
    err[2] = (int)cudaGetLastError();
}

// one thread launches six children: past the pending-launch limit the launch is refused
__global__ void many(int* out, int* codes) {
    for (int k = 0; k < 6; ++k) {
        child<<<1, 1, 0, cudaStreamFireAndForget>>>(out, k, 1);
        codes[k] = (int)cudaGetLastError();
    }
}

// each thread launches into a stream it created (cdpSimpleQuicksort's pattern), with an event
// between; a second destroy, a stream without cudaStreamNonBlocking and an event with timing
// are refused
__global__ void own_streams(int* out, int* codes) {
    int t = threadIdx.x;
    cudaStream_t s, bad;
    cudaEvent_t e, timed;
    int c[8];
    c[0] = (int)cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    child<<<1, 8, 0, s>>>(out, 8 * t, 8);
    c[1] = (int)cudaGetLastError();
    c[2] = (int)cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    c[3] = (int)cudaEventRecord(e, s);
    c[4] = (int)cudaStreamWaitEvent(s, e, 0);
    c[5] = (int)cudaStreamDestroy(s) + (int)cudaEventDestroy(e);
    c[6] = (int)cudaStreamDestroy(s);
    c[7] = (int)cudaStreamCreateWithFlags(&bad, cudaStreamDefault) * 1000 +
           (int)cudaEventCreateWithFlags(&timed, cudaEventDefault);
    if (t == 3)
        for (int k = 0; k < 8; ++k) codes[k] = c[k];
}

int main() {
    const int n = 256;
    int *out, *result, *errs, *reached, *refused, *bad;
    cudaMalloc(&out, n * sizeof(int));
    cudaMalloc(&result, sizeof(int));
    cudaMalloc(&errs, 4 * sizeof(int));
    cudaMalloc(&reached, 64 * sizeof(int));
    cudaMalloc(&refused, sizeof(int));
    cudaMalloc(&bad, 3 * sizeof(int));
    cudaMemset(reached, 0, 64 * sizeof(int));
    parent<<<4, 32>>>(out, result, n, errs);
    nest<<<1, 1>>>(reached, refused, 0);
    bad_config<<<1, 1>>>(bad);
    cudaError_t e = cudaDeviceSynchronize();
    int h[n], r, er[4], levels[64], ref, b[3];
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    cudaMemcpy(&r, result, sizeof r, cudaMemcpyDeviceToHost);
    cudaMemcpy(er, errs, sizeof er, cudaMemcpyDeviceToHost);
    cudaMemcpy(levels, reached, sizeof levels, cudaMemcpyDeviceToHost);
    cudaMemcpy(&ref, refused, sizeof ref, cudaMemcpyDeviceToHost);
    cudaMemcpy(b, bad, sizeof b, cudaMemcpyDeviceToHost);
    bool ok = true;
    long long want = 0;
    for (int i = 0; i < n; ++i) {
        ok &= h[i] == (i / 64) * 64 + 2 * (i % 64);
        want += h[i];
    }
    int depth = 0;
    while (depth < 64 && levels[depth]) ++depth;
    printf("fire-and-forget sync=%s ok=%d h[255]=%d errs=%d%d%d%d\n", cudaGetErrorString(e), ok,
           h[255], er[0], er[1], er[2], er[3]);
    printf("tail sum=%d want=%lld\n", r, want);
    printf("nesting levels=%d refused=%d\n", depth, ref);
    printf("bad config peek=%d get=%d again=%d\n", b[0], b[1], b[2]);
    cudaError_t lim = cudaDeviceSetLimit(cudaLimitDevRuntimePendingLaunchCount, 4);
    int* codes;
    cudaMalloc(&codes, 6 * sizeof(int));
    cudaMemset(out, 0xff, n * sizeof(int));
    many<<<1, 1>>>(out, codes);
    e = cudaDeviceSynchronize();
    int c[6], c8[8];
    cudaMemcpy(c, codes, sizeof c, cudaMemcpyDeviceToHost);
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    printf("pending limit=%s sync=%s codes=%d,%d,%d,%d,%d,%d ran=%d%d%d%d%d%d\n",
           cudaGetErrorString(lim), cudaGetErrorString(e), c[0], c[1], c[2], c[3], c[4], c[5],
           h[0] == 0, h[1] == 1, h[2] == 2, h[3] == 3, h[4] == 4, h[5] == 5);
    int* sc;
    cudaMalloc(&sc, 8 * sizeof(int));
    cudaMemset(out, 0xff, n * sizeof(int));
    own_streams<<<1, 4>>>(out, sc);
    e = cudaDeviceSynchronize();
    cudaMemcpy(c8, sc, sizeof c8, cudaMemcpyDeviceToHost);
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    ok = true;
    for (int i = 0; i < 32; ++i) ok &= h[i] == (i / 8) * 8 + 2 * (i % 8);
    printf("own streams sync=%s ok=%d codes=%d,%d,%d,%d,%d,%d,%d,%d\n", cudaGetErrorString(e), ok,
           c8[0], c8[1], c8[2], c8[3], c8[4], c8[5], c8[6], c8[7]);
    return 0;
}
