// A CUDA program to live-migrate: a loop of real device work whose output is deterministic, so
// a run moved mid-way (VM and GPU state) can be compared line for line with an unmoved run.
//
// Each iteration copies fresh input to the device, runs a kernel that reaches its buffers only
// through device pointers stored in device memory (a module global holding a struct of
// pointers: stale after a move unless addresses are kept), then a kernel that swaps the double
// buffer's pointers there and bumps a module-global round counter; the host reads the current
// buffer's pointer back from the module global and copies results from it. It prints one tick per iteration with a running
// checksum of everything it read back, then the final checksum and the verdict.
//
//     migrate_loop [ITERATIONS=20] [DELAY_MS=0] [N=4096]
// DELAY_MS sleeps between iterations (a migration window without more GPU work).
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <unistd.h>

struct Buffers {
    unsigned int *state;  // read by step()
    unsigned int *next;   // written by step(); bump() swaps the two pointers on the device
    const unsigned int *input;
    unsigned long long *sum;
    unsigned int *table;  // gather: table[i] indexes state
};

__device__ Buffers g_bufs;
__device__ unsigned int g_round;

__global__ void step(int n) {
    const Buffers b = g_bufs;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned int other = b.state[b.table[i]];
    unsigned int x = (b.state[i] * 1664525u + 1013904223u) ^ b.input[i] ^ (other >> 7) ^ g_round;
    b.next[i] = x;
    atomicAdd(b.sum, (unsigned long long)(x & 0xffffu));
}

// One thread: the round counter and the double buffer's pointers live in device memory.
__global__ void bump() {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    unsigned int *t = g_bufs.state;
    g_bufs.state = g_bufs.next;
    g_bufs.next = t;
    g_round += 0x9e37u;
}

#define CK(call)                                                                               \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            printf("FAILED: %s at line %d: %s\n", #call, __LINE__, cudaGetErrorString(e_));    \
            fflush(stdout);                                                                    \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

static unsigned long long mix(unsigned long long h, unsigned long long v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0x100000001b3ull;
}

int main(int argc, char **argv) {
    int iterations = argc > 1 ? atoi(argv[1]) : 20;
    int delay_ms = argc > 2 ? atoi(argv[2]) : 0;
    int n = argc > 3 ? atoi(argv[3]) : 4096;
    if (iterations < 1 || delay_ms < 0 || n < 1 || n > (1 << 22)) {
        printf("usage: migrate_loop [ITERATIONS>=1] [DELAY_MS>=0] [N in 1..4194304]\n");
        return 2;
    }
    unsigned int *h_in = (unsigned int *)malloc(n * sizeof(unsigned int));
    unsigned int *h_state = (unsigned int *)malloc(n * sizeof(unsigned int));
    Buffers b;
    CK(cudaMalloc(&b.state, n * sizeof(unsigned int)));
    CK(cudaMalloc(&b.next, n * sizeof(unsigned int)));
    CK(cudaMalloc((void **)&b.input, n * sizeof(unsigned int)));
    CK(cudaMalloc(&b.sum, sizeof(unsigned long long)));
    CK(cudaMalloc(&b.table, n * sizeof(unsigned int)));
    for (int i = 0; i < n; i++) h_state[i] = (unsigned int)(i * 2654435761u);
    CK(cudaMemcpy(b.state, h_state, n * sizeof(unsigned int), cudaMemcpyHostToDevice));
    for (int i = 0; i < n; i++) h_in[i] = (unsigned int)((i * 7919u + 13u) % (unsigned int)n);
    CK(cudaMemcpy(b.table, h_in, n * sizeof(unsigned int), cudaMemcpyHostToDevice));
    CK(cudaMemcpyToSymbol(g_bufs, &b, sizeof(b)));
    unsigned int zero = 0;
    CK(cudaMemcpyToSymbol(g_round, &zero, sizeof(zero)));
    printf("start iterations=%d n=%d\n", iterations, n);
    fflush(stdout);

    unsigned long long checksum = 0xcbf29ce484222325ull;
    for (int it = 0; it < iterations; it++) {
        for (int i = 0; i < n; i++) h_in[i] = (unsigned int)(it * 0x01000193u) ^ (unsigned int)i;
        CK(cudaMemcpy((void *)b.input, h_in, n * sizeof(unsigned int), cudaMemcpyHostToDevice));
        CK(cudaMemset(b.sum, 0, sizeof(unsigned long long)));
        step<<<(n + 255) / 256, 256>>>(n);
        CK(cudaGetLastError());
        bump<<<1, 32>>>();
        CK(cudaGetLastError());
        unsigned long long sum = 0;
        CK(cudaMemcpy(&sum, b.sum, sizeof(sum), cudaMemcpyDeviceToHost));
        Buffers now;
        CK(cudaMemcpyFromSymbol(&now, g_bufs, sizeof(now)));
        if (now.state != ((it & 1) ? b.state : b.next)) {
            printf("FAILED: tick %d: the device-side pointer swap did not happen\n", it);
            return 1;
        }
        CK(cudaMemcpy(h_state, now.state, n * sizeof(unsigned int), cudaMemcpyDeviceToHost));
        checksum = mix(checksum, sum);
        checksum = mix(checksum, h_state[(it * 31) % n]);
        checksum = mix(checksum, h_state[n - 1 - (it % n)]);
        printf("tick %d sum=%llu checksum=%016llx\n", it, sum, checksum);
        fflush(stdout);
        if (delay_ms) usleep(delay_ms * 1000);
    }
    unsigned int round = 0;
    CK(cudaMemcpyFromSymbol(&round, g_round, sizeof(round)));
    for (int i = 0; i < n; i++) checksum = mix(checksum, h_state[i]);
    printf("final checksum=%016llx round=%u\n", checksum, round);
    bool ok = round == (unsigned int)iterations * 0x9e37u;
    printf("%s\n", ok ? "PASSED" : "FAILED: round counter");
    CK(cudaFree(b.state));
    CK(cudaFree(b.next));
    CK(cudaFree((void *)b.input));
    CK(cudaFree(b.sum));
    CK(cudaFree(b.table));
    free(h_in);
    free(h_state);
    return ok ? 0 : 1;
}
