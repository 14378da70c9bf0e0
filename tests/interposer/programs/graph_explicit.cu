// A CUDA graph built node by node with the runtime API: memset, kernel, 1D memcpy, host and
// empty nodes with explicit dependencies; kernel node parameters read back and changed, in the
// graph and in the instantiated graph.
#include <cstdio>
#include <cuda_runtime.h>
__global__ void axpb(int *p, int n, int a, int b) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = p[i] * a + b + i;
}
static int host_seen;
static int *host_buf;
static void CUDART_CB check(void *) { host_seen = host_buf[5]; }

int main() {
    const int n = 200;
    int *d, h[n];
    host_buf = h;
    cudaMalloc(&d, n * sizeof(int));
    cudaStream_t s;
    cudaStreamCreate(&s);
    cudaGraph_t g;
    cudaGraphCreate(&g, 0);

    cudaMemsetParams ms = {};
    ms.dst = d; ms.value = 2; ms.elementSize = 4; ms.width = n; ms.height = 1;
    cudaGraphNode_t nset, nk, ncopy, nhost, nend;
    cudaError_t e1 = cudaGraphAddMemsetNode(&nset, g, nullptr, 0, &ms);

    int a = 3, b = 1, cnt = n;
    void *args[] = {&d, &cnt, &a, &b};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)axpb; kp.gridDim = dim3((n + 63) / 64); kp.blockDim = dim3(64);
    kp.kernelParams = args;
    cudaError_t e2 = cudaGraphAddKernelNode(&nk, g, &nset, 1, &kp);
    a = 99; b = 99;  // the node copied the values

    cudaError_t e3 = cudaGraphAddMemcpyNode1D(&ncopy, g, nullptr, 0, h, d, n * sizeof(int),
                                              cudaMemcpyDeviceToHost);
    cudaGraphAddDependencies(g, &nk, &ncopy, nullptr, 1);
    cudaHostNodeParams hp = {check, nullptr};
    cudaGraphAddHostNode(&nhost, g, &ncopy, 1, &hp);
    cudaGraphAddEmptyNode(&nend, g, &nhost, 1);

    size_t count = 0, roots = 0;
    cudaGraphGetNodes(g, nullptr, &count);
    cudaGraphNode_t all[8];
    size_t room = 8;
    cudaGraphGetNodes(g, all, &room);
    cudaGraphGetRootNodes(g, nullptr, &roots);
    cudaGraphNodeType t;
    cudaGraphNodeGetType(all[1], &t);
    printf("add memset=%s kernel=%s memcpy=%s nodes=%zu/%zu roots=%zu type1=%d\n",
           cudaGetErrorName(e1), cudaGetErrorName(e2), cudaGetErrorName(e3), count, room, roots,
           (int)t);

    cudaKernelNodeParams got = {};
    cudaGraphKernelNodeGetParams(nk, &got);
    printf("kernel params grid=%u block=%u a=%d b=%d\n", got.gridDim.x, got.blockDim.x,
           *(int *)got.kernelParams[2], *(int *)got.kernelParams[3]);

    cudaGraphExec_t x;
    cudaGraphInstantiate(&x, g, 0);
    cudaGraphLaunch(x, s);
    cudaStreamSynchronize(s);
    printf("run1 h[0]=%d h[5]=%d h[199]=%d host_seen=%d\n", h[0], h[5], h[199], host_seen);

    // change the instantiated graph's kernel: p = p * 10 + 0 + i
    a = 10; b = 0;
    kp.kernelParams = args;
    cudaError_t e4 = cudaGraphExecKernelNodeSetParams(x, nk, &kp);
    cudaGraphLaunch(x, s);
    cudaStreamSynchronize(s);
    printf("run2 set=%s h[0]=%d h[5]=%d host_seen=%d\n", cudaGetErrorName(e4), h[0], h[5],
           host_seen);

    // the graph itself still has a=3,b=1; a fresh update from it restores them
    cudaGraphExecUpdateResultInfo info;
    cudaError_t e5 = cudaGraphExecUpdate(x, g, &info);
    cudaGraphLaunch(x, s);
    cudaStreamSynchronize(s);
    printf("run3 update=%s h[5]=%d err=%s\n", cudaGetErrorName(e5), h[5],
           cudaGetErrorName(cudaGetLastError()));
    cudaGraphExecDestroy(x);
    cudaGraphDestroy(g);
    cudaFree(d);
    return 0;
}
