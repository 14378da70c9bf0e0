// Conditional graph nodes (CUDA 12.4+): if/else, while and switch bodies driven by
// cudaGraphSetConditional from a kernel, each launch checked against the host's answer.
#include <cuda_runtime.h>

#include "check.h"

__global__ void step(cudaGraphConditionalHandle h, int *counter, int limit) {
    int v = ++*counter;
    cudaGraphSetConditional(h, v < limit ? 1 : 0);
}
__global__ void set_to(cudaGraphConditionalHandle h, const int *value) {
    cudaGraphSetConditional(h, (unsigned)*value);
}
__global__ void add(int *p, int v) { *p += v; }

static cudaGraphNode_t kernel(cudaGraph_t g, const cudaGraphNode_t *deps, size_t nd, void *fn,
                              void **args) {
    cudaKernelNodeParams p = {};
    p.func = fn;
    p.gridDim = dim3(1);
    p.blockDim = dim3(1);
    p.kernelParams = args;
    cudaGraphNode_t n;
    cudaGraphAddKernelNode(&n, g, deps, nd, &p);
    return n;
}

static cudaGraphNode_t conditional(cudaGraph_t g, const cudaGraphNode_t *deps, size_t nd,
                                   cudaGraphConditionalHandle h, cudaGraphConditionalNodeType t,
                                   unsigned size, cudaGraph_t **bodies) {
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = h;
    p.conditional.type = t;
    p.conditional.size = size;
    cudaGraphNode_t n;
    cudaError_t e = cudaGraphAddNode(&n, g, deps, nullptr, nd, &p);
    CHECK(e == cudaSuccess, "conditional node type %d: %s", (int)t, cudaGetErrorString(e));
    *bodies = p.conditional.phGraph_out;
    return n;
}

int main() {
    int *counter, *acc, *sel;
    cudaMalloc(&counter, 4);
    cudaMalloc(&acc, 4);
    cudaMalloc(&sel, 4);
    cudaStream_t s;
    cudaStreamCreate(&s);

    // while (++counter < 5) acc += 10: the body runs 4 times after the first test
    cudaGraph_t g;
    cudaGraphCreate(&g, 0);
    cudaGraphConditionalHandle wh;
    CHECK(cudaGraphConditionalHandleCreate(&wh, g, 1, cudaGraphCondAssignDefault) ==
              cudaSuccess,
          "handle");
    int limit = 5, ten = 10;
    void *step_args[] = {&wh, &counter, &limit};
    cudaGraph_t *wbody;
    conditional(g, nullptr, 0, wh, cudaGraphCondTypeWhile, 1, &wbody);
    void *add10[] = {&acc, &ten};
    cudaGraphNode_t k = kernel(wbody[0], nullptr, 0, (void *)add, add10);
    kernel(wbody[0], &k, 1, (void *)step, step_args);
    cudaGraphExec_t x;
    CHECK(cudaGraphInstantiate(&x, g, 0) == cudaSuccess, "instantiate while");
    for (int round = 0; round < 2; round++) {
        cudaMemsetAsync(counter, 0, 4, s);
        cudaMemsetAsync(acc, 0, 4, s);
        CHECK(cudaGraphLaunch(x, s) == cudaSuccess, "launch while");
        int h_acc = -1, h_counter = -1;
        cudaMemcpyAsync(&h_acc, acc, 4, cudaMemcpyDeviceToHost, s);
        cudaMemcpyAsync(&h_counter, counter, 4, cudaMemcpyDeviceToHost, s);
        cudaStreamSynchronize(s);
        CHECK(h_acc == 50 && h_counter == 5, "while round %d: acc %d counter %d", round, h_acc,
              h_counter);
    }
    cudaGraphExecDestroy(x);
    cudaGraphDestroy(g);

    // if/else on a value the first kernel sets; switch over three bodies
    cudaGraph_t g2;
    cudaGraphCreate(&g2, 0);
    cudaGraphConditionalHandle ih, sh;
    cudaGraphConditionalHandleCreate(&ih, g2, 0, 0);
    cudaGraphConditionalHandleCreate(&sh, g2, 0, 0);
    void *set_if[] = {&ih, &sel};
    void *set_sw[] = {&sh, &sel};
    cudaGraphNode_t a = kernel(g2, nullptr, 0, (void *)set_to, set_if);
    cudaGraphNode_t b = kernel(g2, &a, 1, (void *)set_to, set_sw);
    cudaGraph_t *ibody, *sbody;
    cudaGraphNode_t c = conditional(g2, &b, 1, ih, cudaGraphCondTypeIf, 2, &ibody);
    int one = 1, hundred = 100, v1 = 1000, v2 = 20000;
    void *add1[] = {&acc, &one}, *add100[] = {&acc, &hundred};
    kernel(ibody[0], nullptr, 0, (void *)add, add1);
    kernel(ibody[1], nullptr, 0, (void *)add, add100);
    conditional(g2, &c, 1, sh, cudaGraphCondTypeSwitch, 3, &sbody);
    void *addv1[] = {&acc, &v1}, *addv2[] = {&acc, &v2};
    kernel(sbody[1], nullptr, 0, (void *)add, addv1);
    kernel(sbody[2], nullptr, 0, (void *)add, addv2);
    cudaGraphExec_t x2;
    CHECK(cudaGraphInstantiate(&x2, g2, 0) == cudaSuccess, "instantiate if/switch");
    const int want[4] = {100, 1001, 20001, 1};  // sel = 0, 1, 2, 3
    for (int v = 0; v < 4; v++) {
        cudaMemcpyAsync(sel, &v, 4, cudaMemcpyHostToDevice, s);
        cudaMemsetAsync(acc, 0, 4, s);
        cudaGraphLaunch(x2, s);
        int h_acc = -1;
        cudaMemcpyAsync(&h_acc, acc, 4, cudaMemcpyDeviceToHost, s);
        cudaStreamSynchronize(s);
        CHECK(h_acc == want[v], "selector %d: %d, want %d", v, h_acc, want[v]);
    }
    cudaGraphExecDestroy(x2);
    cudaGraphDestroy(g2);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "clean end");
    return finish();
}
