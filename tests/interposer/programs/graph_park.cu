// A CUDA graph captured and instantiated before its session is parked to a file and restored
// on another daemon (or migrated), then launched again: graphs live in the guest, so the same
// executable graph replays after the move. Nodes: two kernels (arguments captured by value),
// a device-to-host copy and a host function; every launch depends on the last.
#include <cstdio>
#include <cuda_runtime.h>
__global__ void step(unsigned *a, int n, unsigned k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = a[i] * 3u + k + (unsigned)i;
}
static int host_calls;
static void CUDART_CB on_host(void *) { ++host_calls; }

int main() {
    const int n = 1000, before = 3, after = 4;
    static unsigned h[n], out[n], want[n];
    for (int i = 0; i < n; ++i) want[i] = h[i] = 7u * i;
    unsigned *a;
    cudaMalloc(&a, n * sizeof(unsigned));
    cudaMemcpy(a, h, n * sizeof(unsigned), cudaMemcpyHostToDevice);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaGraph_t g;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    step<<<(n + 255) / 256, 256, 0, s>>>(a, n, 1u);
    step<<<(n + 255) / 256, 256, 0, s>>>(a, n, 2u);
    cudaMemcpyAsync(out, a, n * sizeof(unsigned), cudaMemcpyDeviceToHost, s);
    cudaLaunchHostFunc(s, on_host, nullptr);
    cudaError_t e1 = cudaStreamEndCapture(s, &g);
    cudaGraphExec_t x;
    cudaError_t e2 = cudaGraphInstantiate(&x, g, 0);
    for (int r = 0; r < before + after; ++r)
        for (int i = 0; i < n; ++i) {
            want[i] = want[i] * 3u + 1u + (unsigned)i;
            want[i] = want[i] * 3u + 2u + (unsigned)i;
        }
    for (int r = 0; r < before; ++r) cudaGraphLaunch(x, s);
    cudaError_t e3 = cudaStreamSynchronize(s);
    printf("before capture=%s inst=%s sync=%s host_calls=%d\n", cudaGetErrorName(e1),
           cudaGetErrorName(e2), cudaGetErrorName(e3), host_calls);
    printf("ready\n");
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin)) return 2;  // the test moves the session meanwhile
    for (int r = 0; r < after; ++r) cudaGraphLaunch(x, s);
    cudaError_t e4 = cudaStreamSynchronize(s);
    bool ok = true;
    for (int i = 0; i < n; ++i) ok = ok && out[i] == want[i];
    printf("after launch=%s ok=%d host_calls=%d out[999]=%u\n", cudaGetErrorName(e4), (int)ok,
           host_calls, out[999]);
    cudaGraphExecDestroy(x);
    cudaGraphDestroy(g);
    return ok ? 0 : 1;
}
