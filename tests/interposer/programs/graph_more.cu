// Child graphs, clones and graph memory nodes (captured cudaMallocAsync/cudaFreeAsync and
// explicit allocation/free nodes), each launch checked against the host's answer.
#include <cstdint>
#include <cuda_runtime.h>

#include "check.h"

__global__ void fill(int *p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v + i;
}
__global__ void add(int *p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += v;
}
__global__ void copy_twice(const int *src, int *dst, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = 2 * src[i];
}

static cudaGraphNode_t kernel_node(cudaGraph_t g, const cudaGraphNode_t *deps, size_t nd,
                                   void *fn, void **args, int n) {
    cudaKernelNodeParams p = {};
    p.func = fn;
    p.gridDim = dim3((n + 127) / 128);
    p.blockDim = dim3(128);
    p.kernelParams = args;
    cudaGraphNode_t node;
    cudaGraphAddKernelNode(&node, g, deps, nd, &p);
    return node;
}

int main() {
    const int n = 1000;
    int *d;
    cudaMalloc(&d, n * sizeof(int));
    int h[n];

    // ---- a child graph inside a parent, and a clone of the parent -----------------------
    cudaGraph_t child, parent;
    cudaGraphCreate(&child, 0);
    int nn = n, v = 10, w = 5;
    void *fill_args[] = {&d, &nn, &v};
    kernel_node(child, nullptr, 0, (void *)fill, fill_args, n);
    cudaGraphCreate(&parent, 0);
    cudaGraphNode_t cnode;
    CHECK(cudaGraphAddChildGraphNode(&cnode, parent, nullptr, 0, child) == cudaSuccess,
          "child node");
    void *add_args[] = {&d, &nn, &w};
    cudaGraphNode_t addnode = kernel_node(parent, &cnode, 1, (void *)add, add_args, n);
    cudaGraphNodeType t;
    cudaGraphNodeGetType(cnode, &t);
    CHECK(t == cudaGraphNodeTypeGraph, "child node type %d", (int)t);
    cudaGraph_t embedded;
    CHECK(cudaGraphChildGraphNodeGetGraph(cnode, &embedded) == cudaSuccess && embedded != child,
          "the node holds its own copy of the child");
    cudaGraphDestroy(child);  // the parent keeps its copy
    cudaGraphExec_t px;
    CHECK(cudaGraphInstantiate(&px, parent, 0) == cudaSuccess, "instantiate parent");
    cudaGraphLaunch(px, 0);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    CHECK(h[0] == 15 && h[n - 1] == 15 + n - 1, "child then parent kernel: %d %d", h[0],
          h[n - 1]);

    cudaGraph_t clone;
    CHECK(cudaGraphClone(&clone, parent) == cudaSuccess, "clone");
    cudaGraphNode_t cadd;
    CHECK(cudaGraphNodeFindInClone(&cadd, addnode, clone) == cudaSuccess && cadd != addnode,
          "find in clone");
    int w2 = 100;
    void *add2[] = {&d, &nn, &w2};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)add;
    kp.gridDim = dim3((n + 127) / 128);
    kp.blockDim = dim3(128);
    kp.kernelParams = add2;
    cudaGraphKernelNodeSetParams(cadd, &kp);
    cudaGraphExec_t cx;
    cudaGraphInstantiate(&cx, clone, 0);
    cudaGraphLaunch(cx, 0);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    CHECK(h[7] == 117, "clone's changed kernel: %d", h[7]);
    cudaGraphLaunch(px, 0);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    CHECK(h[7] == 22, "original unchanged by the clone: %d", h[7]);
    cudaGraphExecDestroy(cx);
    cudaGraphExecDestroy(px);
    cudaGraphDestroy(clone);
    cudaGraphDestroy(parent);

    // ---- stream capture of cudaMallocAsync / cudaFreeAsync --------------------------------
    cudaStream_t s;
    cudaStreamCreate(&s);
    int *out;
    cudaMalloc(&out, n * sizeof(int));
    cudaGraph_t cap;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    int *tmp = nullptr;
    CHECK(cudaMallocAsync(&tmp, n * sizeof(int), s) == cudaSuccess, "captured malloc");
    fill<<<(n + 127) / 128, 128, 0, s>>>(tmp, n, 3);
    copy_twice<<<(n + 127) / 128, 128, 0, s>>>(tmp, out, n);
    CHECK(cudaFreeAsync(tmp, s) == cudaSuccess, "captured free");
    CHECK(cudaStreamEndCapture(s, &cap) == cudaSuccess, "end capture");
    size_t count = 0;
    cudaGraphGetNodes(cap, nullptr, &count);
    CHECK(count == 4, "alloc, two kernels, free: %zu nodes", count);
    cudaGraphNode_t nodes[4];
    cudaGraphGetNodes(cap, nodes, &count);
    cudaGraphNodeGetType(nodes[0], &t);
    CHECK(t == cudaGraphNodeTypeMemAlloc, "first node type %d", (int)t);
    cudaGraphNodeGetType(nodes[3], &t);
    CHECK(t == cudaGraphNodeTypeMemFree, "last node type %d", (int)t);
    cudaMemAllocNodeParams ap;
    cudaGraphMemAllocNodeGetParams(nodes[0], &ap);
    CHECK(ap.dptr == tmp && ap.bytesize == n * sizeof(int), "allocation node parameters");
    cudaGraphExec_t capx;
    CHECK(cudaGraphInstantiate(&capx, cap, 0) == cudaSuccess, "instantiate captured graph");
    for (int round = 0; round < 3; round++) {
        cudaMemsetAsync(out, 0, n * sizeof(int), s);
        CHECK(cudaGraphLaunch(capx, s) == cudaSuccess, "launch %d", round);
        cudaMemcpyAsync(h, out, sizeof h, cudaMemcpyDeviceToHost, s);
        cudaStreamSynchronize(s);
        CHECK(h[0] == 6 && h[n - 1] == 2 * (3 + n - 1), "round %d: %d %d", round, h[0],
              h[n - 1]);
    }
    uint64_t used = 0;
    cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &used);
    CHECK(used >= n * sizeof(int), "graph memory in use %llu", (unsigned long long)used);
    cudaGraphExecDestroy(capx);
    cudaGraphDestroy(cap);
    cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemCurrent, &used);
    CHECK(used == 0, "graph memory after destroy %llu", (unsigned long long)used);
    uint64_t high = 0;
    cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &high);
    CHECK(high >= n * sizeof(int), "high watermark %llu", (unsigned long long)high);
    CHECK(cudaDeviceGraphMemTrim(0) == cudaSuccess, "trim");

    // ---- explicit allocation and free nodes ------------------------------------------------
    cudaGraph_t g;
    cudaGraphCreate(&g, 0);
    cudaMemAllocNodeParams mp = {};
    mp.poolProps.allocType = cudaMemAllocationTypePinned;
    mp.poolProps.location.type = cudaMemLocationTypeDevice;
    mp.poolProps.location.id = 0;
    mp.bytesize = n * sizeof(int);
    cudaGraphNode_t an;
    CHECK(cudaGraphAddMemAllocNode(&an, g, nullptr, 0, &mp) == cudaSuccess && mp.dptr,
          "allocation node");
    int *gm = (int *)mp.dptr;
    int seven = 7;
    void *f7[] = {&gm, &nn, &seven};
    cudaGraphNode_t k1 = kernel_node(g, &an, 1, (void *)fill, f7, n);
    void *cp[] = {&gm, &out, &nn};
    cudaGraphNode_t k2 = kernel_node(g, &k1, 1, (void *)copy_twice, cp, n);
    cudaGraphNode_t fn;
    CHECK(cudaGraphAddMemFreeNode(&fn, g, &k2, 1, gm) == cudaSuccess, "free node");
    void *freed = nullptr;
    cudaGraphMemFreeNodeGetParams(fn, &freed);
    CHECK(freed == gm, "free node parameters");
    cudaGraphExec_t gx;
    cudaGraphInstantiate(&gx, g, 0);
    cudaGraphLaunch(gx, s);
    cudaGraphLaunch(gx, s);
    cudaMemcpyAsync(h, out, sizeof h, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    CHECK(h[10] == 34, "explicit memory nodes: %d", h[10]);
    cudaGraphExecDestroy(gx);
    cudaGraphDestroy(g);
    // ---- updating an executable graph node by node ---------------------------------------
    cudaGraph_t u;
    cudaGraphCreate(&u, 0);
    cudaMemsetParams ms = {};
    ms.dst = d;
    ms.value = 1;
    ms.elementSize = 4;
    ms.width = n;
    ms.height = 1;
    cudaGraphNode_t msn;
    cudaGraphAddMemsetNode(&msn, u, nullptr, 0, &ms);
    int three = 3;
    void *a3[] = {&d, &nn, &three};
    cudaGraphNode_t ak = kernel_node(u, &msn, 1, (void *)add, a3, n);
    cudaGraph_t sub;
    cudaGraphCreate(&sub, 0);
    void *a1[] = {&d, &nn, &seven};
    kernel_node(sub, nullptr, 0, (void *)add, a1, n);
    cudaGraphNode_t subn;
    cudaGraphAddChildGraphNode(&subn, u, &ak, 1, sub);
    cudaEvent_t e1, e2;
    cudaEventCreate(&e1);
    cudaEventCreate(&e2);
    cudaGraphNode_t en;
    cudaGraphAddEventRecordNode(&en, u, &subn, 1, e1);
    cudaGraphExec_t ux;
    cudaGraphInstantiate(&ux, u, 0);
    cudaGraphLaunch(ux, s);
    cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    CHECK(h[5] == 11, "memset 1 + 3 + 7: %d", h[5]);
    ms.value = 100;
    CHECK(cudaGraphExecMemsetNodeSetParams(ux, msn, &ms) == cudaSuccess, "exec memset update");
    CHECK(cudaGraphNodeSetEnabled(ux, ak, 0) == cudaSuccess, "disable the kernel");
    unsigned on = 1;
    cudaGraphNodeGetEnabled(ux, ak, &on);
    CHECK(on == 0, "disabled reads back %u", on);
    cudaGraph_t sub2;
    cudaGraphCreate(&sub2, 0);
    int fifty = 50;
    void *a50[] = {&d, &nn, &fifty};
    kernel_node(sub2, nullptr, 0, (void *)add, a50, n);
    CHECK(cudaGraphExecChildGraphNodeSetParams(ux, subn, sub2) == cudaSuccess,
          "exec child update");
    CHECK(cudaGraphExecEventRecordNodeSetEvent(ux, en, e2) == cudaSuccess, "exec event update");
    cudaGraphLaunch(ux, s);
    cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    CHECK(h[5] == 150, "memset 100, kernel disabled, child adds 50: %d", h[5]);
    CHECK(cudaEventQuery(e2) == cudaSuccess, "the updated event was recorded");
    cudaEvent_t got_e;
    cudaGraphEventRecordNodeGetEvent(en, &got_e);
    CHECK(got_e == e1, "the graph's own node keeps its event");
    cudaMemsetParams back = {};
    cudaGraphMemsetNodeGetParams(msn, &back);
    CHECK(back.value == 1 && back.width == (size_t)n && back.dst == d, "memset node params");
    cudaGraphExecDestroy(ux);
    cudaGraphDestroy(u);
    cudaGraphDestroy(sub);
    cudaGraphDestroy(sub2);

    // ---- the generic node API: cudaGraphAddNode / NodeSetParams / ExecNodeSetParams -------
    cudaGraph_t gg;
    cudaGraphCreate(&gg, 0);
    cudaGraphNodeParams ap2 = {};
    ap2.type = cudaGraphNodeTypeMemAlloc;
    ap2.alloc.poolProps.allocType = cudaMemAllocationTypePinned;
    ap2.alloc.poolProps.location.type = cudaMemLocationTypeDevice;
    ap2.alloc.bytesize = n * sizeof(int);
    cudaGraphNode_t ga;
    CHECK(cudaGraphAddNode(&ga, gg, nullptr, nullptr, 0, &ap2) == cudaSuccess && ap2.alloc.dptr,
          "generic allocation node");
    int *gp = (int *)ap2.alloc.dptr;
    cudaGraphNodeParams sp = {};
    sp.type = cudaGraphNodeTypeMemset;
    sp.memset.dst = gp;
    sp.memset.value = 4;
    sp.memset.elementSize = 4;
    sp.memset.width = n;
    sp.memset.height = 1;
    cudaGraphNode_t gs;
    CHECK(cudaGraphAddNode(&gs, gg, &ga, nullptr, 1, &sp) == cudaSuccess, "generic memset node");
    int nine = 9;
    void *k9[] = {&gp, &nn, &nine};
    cudaGraphNodeParams kp2 = {};
    kp2.type = cudaGraphNodeTypeKernel;
    kp2.kernel.func = (void *)add;
    kp2.kernel.gridDim = dim3((n + 127) / 128);
    kp2.kernel.blockDim = dim3(128);
    kp2.kernel.kernelParams = k9;
    cudaGraphNode_t gk;
    CHECK(cudaGraphAddNode(&gk, gg, &gs, nullptr, 1, &kp2) == cudaSuccess, "generic kernel node");
    cudaGraphNodeParams cpp = {};
    cpp.type = cudaGraphNodeTypeMemcpy;
    cpp.memcpy.copyParams.srcPtr = make_cudaPitchedPtr(gp, n * sizeof(int), n, 1);
    cpp.memcpy.copyParams.dstPtr = make_cudaPitchedPtr(h, n * sizeof(int), n, 1);
    cpp.memcpy.copyParams.extent = make_cudaExtent(n * sizeof(int), 1, 1);
    cpp.memcpy.copyParams.kind = cudaMemcpyDeviceToHost;
    cudaGraphNode_t gc;
    CHECK(cudaGraphAddNode(&gc, gg, &gk, nullptr, 1, &cpp) == cudaSuccess, "generic memcpy node");
    cudaGraphNodeParams fp = {};
    fp.type = cudaGraphNodeTypeMemFree;
    fp.free.dptr = gp;
    cudaGraphNode_t gf;
    CHECK(cudaGraphAddNode(&gf, gg, &gc, nullptr, 1, &fp) == cudaSuccess, "generic free node");
    cudaGraphExec_t ggx;
    cudaGraphInstantiate(&ggx, gg, 0);
    cudaGraphLaunch(ggx, s);
    cudaStreamSynchronize(s);
    CHECK(h[3] == 13, "generic nodes: memset 4 + 9 = %d", h[3]);
    int twenty = 20;
    void *k20[] = {&gp, &nn, &twenty};
    kp2.kernel.kernelParams = k20;
    CHECK(cudaGraphExecNodeSetParams(ggx, gk, &kp2) == cudaSuccess, "exec generic update");
    cudaGraphLaunch(ggx, s);
    cudaStreamSynchronize(s);
    CHECK(h[3] == 24, "after the exec update: %d", h[3]);
    sp.memset.value = 1;
    CHECK(cudaGraphNodeSetParams(gs, &sp) == cudaSuccess, "graph node update");
    CHECK(cudaGraphNodeSetParams(gs, &kp2) == cudaErrorInvalidValue, "type mismatch refused");
    cudaGetLastError();
    cudaGraphExec_t ggx2;
    cudaGraphInstantiate(&ggx2, gg, 0);
    cudaGraphLaunch(ggx2, s);
    cudaStreamSynchronize(s);
    CHECK(h[3] == 10, "the graph's updated memset, the graph's own kernel: %d", h[3]);
    cudaGraphNodeParams cond = {};
    cond.type = cudaGraphNodeTypeConditional;
    cudaGraphNode_t gcond;
    CHECK(cudaGraphAddNode(&gcond, gg, nullptr, nullptr, 0, &cond) != cudaSuccess, "a conditional node without a handle refused");
    cudaGetLastError();
    cudaGraphExecDestroy(ggx);
    cudaGraphExecDestroy(ggx2);
    cudaGraphDestroy(gg);

    CHECK(cudaDeviceSynchronize() == cudaSuccess, "clean end");
    return finish();
}
