// Illegal calls during stream capture return the driver's errors and invalidate the capture;
// legal work afterwards runs normally.
#include <cstdio>
#include <cuda_runtime.h>
__global__ void add(int *p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += v;
}
#define NAME(x) cudaGetErrorName(x)

int main() {
    const int n = 64;
    int *d, h[n];
    cudaMalloc(&d, n * sizeof(int));
    cudaMemset(d, 0, n * sizeof(int));
    cudaStream_t s, s2, nb;
    cudaStreamCreate(&s);
    cudaStreamCreate(&s2);
    cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking);
    cudaGraph_t g;

    // a synchronous copy while a global-mode capture is active
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    add<<<1, n, 0, s>>>(d, n, 1);
    cudaError_t sync_copy = cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost);
    cudaStreamCaptureStatus st;
    cudaStreamIsCapturing(s, &st);
    add<<<1, n, 0, s>>>(d, n, 1);
    cudaError_t after = cudaGetLastError();
    g = (cudaGraph_t)0x1;
    cudaError_t end = cudaStreamEndCapture(s, &g);
    printf("memcpy=%s status=%d launch_after=%s end=%s graph_null=%d\n", NAME(sync_copy),
           (int)st, NAME(after), NAME(end), g == nullptr);

    // synchronizing the capturing stream
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    cudaError_t ssync = cudaStreamSynchronize(s);
    end = cudaStreamEndCapture(s, &g);
    printf("stream_sync=%s end=%s\n", NAME(ssync), NAME(end));
    cudaGetLastError();

    // the legacy stream cannot be captured; ending a capture that never began
    cudaError_t legacy = cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal);
    cudaGetLastError();
    cudaError_t not_capturing = cudaStreamEndCapture(s, &g);
    cudaGetLastError();
    printf("begin_legacy=%s end_idle=%s\n", NAME(legacy), NAME(not_capturing));

    // work on the legacy stream while a blocking stream captures
    cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    add<<<1, n>>>(d, n, 1);
    cudaError_t implicit = cudaGetLastError();
    end = cudaStreamEndCapture(s, &g);
    printf("legacy_launch=%s end=%s\n", NAME(implicit), NAME(end));

    // a fork that is never joined back
    cudaEvent_t e;
    cudaEventCreate(&e);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    cudaEventRecord(e, s);
    cudaStreamWaitEvent(s2, e, 0);
    add<<<1, n, 0, s2>>>(d, n, 1);
    cudaError_t q = cudaEventQuery(e);
    end = cudaStreamEndCapture(s, &g);
    cudaStreamIsCapturing(s2, &st);
    printf("event_query=%s\n", NAME(q));
    cudaGetLastError();
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    cudaEventRecord(e, s);
    cudaStreamWaitEvent(s2, e, 0);
    add<<<1, n, 0, s2>>>(d, n, 1);
    end = cudaStreamEndCapture(s, &g);
    cudaStreamIsCapturing(s2, &st);
    printf("unjoined end=%s s2_status=%d\n", NAME(end), (int)st);
    cudaGetLastError();

    // relaxed mode allows allocation; a nonblocking stream leaves the legacy stream free
    int *tmp = nullptr;
    cudaStreamBeginCapture(nb, cudaStreamCaptureModeRelaxed);
    cudaError_t m = cudaMalloc(&tmp, 256);
    add<<<1, n, 0, nb>>>(d, n, 5);
    end = cudaStreamEndCapture(nb, &g);
    cudaGraphExec_t x;
    cudaGraphInstantiate(&x, g, 0);
    cudaGraphLaunch(x, nb);
    cudaStreamSynchronize(nb);
    cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost);
    printf("relaxed malloc=%s end=%s h[0]=%d h[63]=%d\n", NAME(m), NAME(end), h[0], h[63]);

    // global mode forbids allocation
    cudaStreamBeginCapture(nb, cudaStreamCaptureModeGlobal);
    cudaError_t m2 = cudaMalloc(&tmp, 256);
    end = cudaStreamEndCapture(nb, &g);
    printf("global malloc=%s end=%s\n", NAME(m2), NAME(end));
    cudaGetLastError();

    add<<<1, n, 0, s>>>(d, n, 100);
    cudaError_t fin = cudaStreamSynchronize(s);
    cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost);
    printf("after sync=%s h[0]=%d\n", NAME(fin), h[0]);
    return 0;
}
