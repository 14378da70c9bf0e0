// Streams, events and host callbacks: two streams fill halves of a buffer, an event orders a
// third step after both, a host function and a stream callback run in stream order.
#include <cstdio>
#include <cuda_runtime.h>
__global__ void fill(int *p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v + i;
}
__global__ void twice(int *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] *= 2;
}
static int order[8], norder;
static void CUDART_CB host_fn(void *arg) { order[norder++] = (int)(long)arg; }
static void CUDART_CB stream_cb(cudaStream_t, cudaError_t status, void *arg) {
    order[norder++] = status == cudaSuccess ? (int)(long)arg : -1;
}
int main() {
    const int n = 512;
    int *d, h[n];
    cudaStream_t s1, s2;
    cudaEvent_t e1, e2, t0, t1;
    cudaMalloc(&d, n * sizeof(int));
    cudaStreamCreate(&s1);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    cudaEventCreate(&e1); cudaEventCreateWithFlags(&e2, cudaEventDisableTiming);
    cudaEventCreate(&t0); cudaEventCreate(&t1);
    cudaEventRecord(t0, s1);
    fill<<<1, 256, 0, s1>>>(d, 256, 0);
    cudaLaunchHostFunc(s1, host_fn, (void *)1);
    fill<<<1, 256, 0, s2>>>(d + 256, 256, 1000);
    cudaStreamAddCallback(s2, stream_cb, (void *)2, 0);
    cudaEventRecord(e2, s2);
    cudaStreamWaitEvent(s1, e2, 0);
    twice<<<2, 256, 0, s1>>>(d, n);
    cudaLaunchHostFunc(s1, host_fn, (void *)3);
    cudaEventRecord(t1, s1);
    cudaEventRecord(e1, s1);
    cudaEventSynchronize(e1);
    float ms = -1;
    cudaError_t et = cudaEventElapsedTime(&ms, t0, t1);
    cudaError_t q = cudaStreamQuery(s1);
    cudaMemcpyAsync(h, d, n * sizeof(int), cudaMemcpyDeviceToHost, s1);
    cudaStreamSynchronize(s1);
    printf("h[0]=%d h[255]=%d h[256]=%d h[511]=%d\n", h[0], h[255], h[256], h[511]);
    printf("order=%d,%d,%d n=%d query=%s elapsed=%s %s\n", order[0], order[1], order[2], norder,
           cudaGetErrorName(q), cudaGetErrorName(et), ms >= 0 ? "nonneg" : "negative");
    cudaEventDestroy(e1); cudaEventDestroy(e2); cudaEventDestroy(t0); cudaEventDestroy(t1);
    cudaStreamDestroy(s1); cudaStreamDestroy(s2);
    cudaFree(d);
    printf("done %s\n", cudaGetErrorName(cudaGetLastError()));
    return 0;
}
