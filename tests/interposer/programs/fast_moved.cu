// Memsets, device-to-device copies and event records queued by the guest library's fast lane
// (interposer/src/fastlane.c) before and after the session moves (parked and restored, or
// migrated live, while the program waits on stdin): the move keeps the allocations, streams
// and events the lane was taught, and every byte must be what the same calls give unmoved.
// The last line says whether the lane took the loops' calls on both sides of the move.
#include <cstdio>
#include <cstring>
#include <dlfcn.h>
#include <cuda_runtime.h>

static unsigned long long fast_calls() {
    typedef unsigned long long (*fn)(void);
    fn f = (fn)dlsym(RTLD_DEFAULT, "crane_fast_calls");
    return f ? f() : 0;
}

enum { N = 8192, LOOP = 2000 };
static unsigned char ha[N], hb[N], got[N];

static void round_of(unsigned char *a, unsigned char *b, cudaStream_t s, cudaEvent_t e, int k) {
    for (int i = 0; i < LOOP; i++) {
        int off = (i * 29 + k * 7) % (N - 64);
        cudaMemsetAsync(a + off, (unsigned char)(i + k), 5, s);
        memset(ha + off, (unsigned char)(i + k), 5);
        if (i % 4 == 0) {
            int to = (i * 13 + k) % (N - 64);
            cudaMemcpyAsync(b + to, a + off, 16, cudaMemcpyDeviceToDevice, s);
            memcpy(hb + to, ha + off, 16);
            cudaEventRecord(e, s);
        }
    }
}

static int same(unsigned char *a, unsigned char *b) {
    cudaDeviceSynchronize();
    cudaMemcpy(got, a, N, cudaMemcpyDeviceToHost);
    int ok = !memcmp(got, ha, N);
    cudaMemcpy(got, b, N, cudaMemcpyDeviceToHost);
    return ok && !memcmp(got, hb, N);
}

int main() {
    unsigned char *a, *b;
    cudaMalloc(&a, N);
    cudaMalloc(&b, N);
    cudaMemset(a, 0, N);
    cudaMemset(b, 0, N);
    cudaStream_t s;
    cudaStreamCreate(&s);
    cudaEvent_t e;
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    unsigned long long f0 = fast_calls();
    round_of(a, b, s, e, 1);
    int before = same(a, b);
    unsigned long long f1 = fast_calls();
    round_of(a, b, s, e, 2);  // left queued (no synchronize) while the move begins
    printf("before same=%d\nready\n", before);
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;
    round_of(a, b, s, e, 3);
    int after = same(a, b);
    unsigned long long f2 = fast_calls();
    cudaError_t err = cudaGetLastError();
    printf("after same=%d error=%s\n", after, cudaGetErrorName(err));
    fprintf(stderr, "calls queued by the fast lane: before %llu, across and after %llu\n",
            f1 - f0, f2 - f1);
    // each side: most of its LOOP memsets, LOOP/4 copies and LOOP/4 records
    int per = LOOP + LOOP / 2;
    printf("fast %s\n", f1 - f0 >= (unsigned long long)per * 9 / 10 &&
                                f2 - f1 >= (unsigned long long)2 * per * 9 / 10
                            ? "yes"
                            : "no");
    return err != cudaSuccess;
}
