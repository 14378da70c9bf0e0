// A CUDA graph captured from a stream: an async upload, kernels, a fork onto a second stream
// and a join back through events, a download and a host function; instantiated once and
// launched several times. Kernel arguments are captured by value. Then a 50-kernel chain.
#include <cstdio>
#include <cuda_runtime.h>
__global__ void add(int *p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += v;
}
__global__ void accum(int *b, const int *a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) b[i] += a[i];
}
__global__ void sum3(int *out, const int *a, const int *b, const int *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i] + c[i];
}
static int host_calls;
static void CUDART_CB on_host(void *arg) { host_calls += (int)(long)arg; }

int main() {
    const int n = 300, N = 5;
    int h_in[n], h_out[n];
    for (int i = 0; i < n; ++i) h_in[i] = i;
    int *a, *b, *c, *out;
    cudaMalloc(&a, n * sizeof(int)); cudaMalloc(&b, n * sizeof(int));
    cudaMalloc(&c, n * sizeof(int)); cudaMalloc(&out, n * sizeof(int));
    cudaMemset(b, 0, n * sizeof(int)); cudaMemset(c, 0, n * sizeof(int));
    cudaStream_t s1, s2;
    cudaStreamCreate(&s1);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    cudaEvent_t fork, join;
    cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
    cudaDeviceSynchronize();

    cudaStreamCaptureStatus st1, st2, st0;
    cudaStreamIsCapturing(s1, &st0);
    cudaError_t e = cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal);
    int one = 1;
    cudaMemcpyAsync(a, h_in, n * sizeof(int), cudaMemcpyHostToDevice, s1);
    add<<<(n + 127) / 128, 128, 0, s1>>>(a, n, one);
    one = 1000;  // the node keeps the value it was launched with
    cudaEventRecord(fork, s1);
    cudaStreamWaitEvent(s2, fork, 0);
    accum<<<(n + 127) / 128, 128, 0, s2>>>(b, a, n);
    add<<<(n + 127) / 128, 128, 0, s1>>>(c, n, 1);
    cudaStreamIsCapturing(s1, &st1);
    cudaStreamIsCapturing(s2, &st2);
    unsigned long long id1 = 0, id2 = 0;
    cudaStreamGetCaptureInfo(s1, &st1, &id1);
    cudaStreamGetCaptureInfo(s2, &st2, &id2);
    cudaEventRecord(join, s2);
    cudaStreamWaitEvent(s1, join, 0);
    sum3<<<(n + 127) / 128, 128, 0, s1>>>(out, a, b, c, n);
    cudaMemcpyAsync(h_out, out, n * sizeof(int), cudaMemcpyDeviceToHost, s1);
    cudaLaunchHostFunc(s1, on_host, (void *)1);
    cudaGraph_t g = nullptr;
    cudaError_t e2 = cudaStreamEndCapture(s1, &g);
    cudaStreamCaptureStatus after;
    cudaStreamIsCapturing(s2, &after);
    printf("capture begin=%s end=%s before=%d during=%d,%d same_id=%d after=%d\n",
           cudaGetErrorName(e), cudaGetErrorName(e2), (int)st0, (int)st1, (int)st2,
           id1 == id2 && id1 != 0, (int)after);

    size_t nodes = 0, roots = 0;
    cudaGraphGetNodes(g, nullptr, &nodes);
    cudaGraphGetRootNodes(g, nullptr, &roots);
    printf("graph nodes=%zu roots=%zu\n", nodes, roots);

    cudaGraphExec_t x;
    e = cudaGraphInstantiate(&x, g, 0);
    host_calls = 0;
    for (int it = 0; it < N; ++it) cudaGraphLaunch(x, s1);
    e2 = cudaStreamSynchronize(s1);
    bool ok = true;
    for (int i = 0; i < n; ++i)
        if (h_out[i] != (i + 1) * (N + 1) + N) ok = false;
    printf("launches=%d inst=%s sync=%s ok=%d out[7]=%d host_calls=%d\n", N, cudaGetErrorName(e),
           cudaGetErrorName(e2), (int)ok, h_out[7], host_calls);

    // a long chain: one launch of the graph replays 50 kernels in order
    cudaMemset(a, 0, n * sizeof(int));
    cudaDeviceSynchronize();
    cudaGraph_t g2;
    cudaStreamBeginCapture(s2, cudaStreamCaptureModeThreadLocal);
    for (int k = 0; k < 50; ++k) add<<<(n + 127) / 128, 128, 0, s2>>>(a, n, k);
    cudaStreamEndCapture(s2, &g2);
    cudaGraphExec_t x2;
    cudaGraphInstantiateWithFlags(&x2, g2, 0);
    cudaGraphLaunch(x2, s2);
    cudaGraphLaunch(x2, s1);  // another stream: runs after the first launch
    cudaDeviceSynchronize();
    cudaMemcpy(h_out, a, n * sizeof(int), cudaMemcpyDeviceToHost);
    printf("chain a[0]=%d a[299]=%d err=%s\n", h_out[0], h_out[299],
           cudaGetErrorName(cudaGetLastError()));
    cudaGraphExecDestroy(x); cudaGraphExecDestroy(x2);
    cudaGraphDestroy(g); cudaGraphDestroy(g2);
    return 0;
}
