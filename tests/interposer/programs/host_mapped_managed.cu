// Zero-copy (mapped pinned) memory and managed memory under the model a session is told:
// no concurrent managed access, host and device see each other's writes at synchronization.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#include "check.h"

__global__ void axpb(const float *x, float *y, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}

__global__ void bump(int *v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] += i;
}

struct Node {
    int value;
    Node *next;
};

__global__ void walk(Node *head, int *sum) {
    int s = 0;
    for (Node *p = head; p; p = p->next) s += p->value;
    *sum = s;
}

int main() {
    int dev = 0;
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, dev);
    CHECK(prop.canMapHostMemory == 1 && prop.managedMemory == 1, "capabilities");
    CHECK(prop.concurrentManagedAccess == 0, "concurrent managed access reported %d",
          prop.concurrentManagedAccess);
    cudaSetDeviceFlags(cudaDeviceMapHost);
    const int n = 10000;

    // ---- zero-copy: cudaHostAlloc(Mapped) + cudaHostGetDevicePointer ---------------------
    float *hx, *hy, *dx, *dy;
    CHECK(cudaHostAlloc(&hx, n * sizeof(float), cudaHostAllocMapped) == cudaSuccess, "alloc x");
    CHECK(cudaHostAlloc(&hy, n * sizeof(float), cudaHostAllocMapped | cudaHostAllocPortable) ==
              cudaSuccess,
          "alloc y");
    for (int i = 0; i < n; i++) hx[i] = (float)i, hy[i] = -1.f;
    CHECK(cudaHostGetDevicePointer(&dx, hx, 0) == cudaSuccess, "device pointer x");
    CHECK(cudaHostGetDevicePointer(&dy, hy, 0) == cudaSuccess, "device pointer y");
    CHECK(dx == hx, "unified addressing: device pointer %p == host pointer %p", dx, hx);
    axpb<<<(n + 255) / 256, 256>>>(dx, dy, 2.f, 1.f, n);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "sync");
    int bad = 0;
    for (int i = 0; i < n; i++) bad += hy[i] != 2.f * i + 1.f;
    CHECK(bad == 0, "zero-copy results: %d wrong", bad);
    // the host changes the input, the device sees it at the next launch
    for (int i = 0; i < n; i += 3) hx[i] = 1000.f;
    axpb<<<(n + 255) / 256, 256>>>(hx, hy, 1.f, 0.f, n);  // host pointers work too (UVA)
    cudaStreamSynchronize(0);
    bad = 0;
    for (int i = 0; i < n; i++) bad += hy[i] != (i % 3 ? (float)i : 1000.f);
    CHECK(bad == 0, "host writes seen by the next launch: %d wrong", bad);
    cudaPointerAttributes pa;
    CHECK(cudaPointerGetAttributes(&pa, hx) == cudaSuccess && pa.type == cudaMemoryTypeHost,
          "mapped pointer type %d", (int)pa.type);
    unsigned flags = 0;
    cudaHostGetFlags(&flags, hy);
    CHECK(flags == (cudaHostAllocMapped | cudaHostAllocPortable), "flags %u", flags);
    CHECK(cudaFreeHost(hx) == cudaSuccess && cudaFreeHost(hy) == cudaSuccess, "free host");

    // ---- registered memory (cudaHostRegisterMapped): a device pointer of its own -----------
    int *reg = (int *)aligned_alloc(4096, 8192);
    for (int i = 0; i < 2048; i++) reg[i] = 5;
    CHECK(cudaHostRegister(reg, 8192, cudaHostRegisterMapped) == cudaSuccess, "register");
    int *dreg;
    CHECK(cudaHostGetDevicePointer(&dreg, reg, 0) == cudaSuccess, "registered device pointer");
    bump<<<8, 256>>>(dreg, 2048);
    cudaDeviceSynchronize();
    bad = 0;
    for (int i = 0; i < 2048; i++) bad += reg[i] != 5 + i;
    CHECK(bad == 0, "registered results: %d wrong", bad);
    CHECK(cudaHostUnregister(reg) == cudaSuccess, "unregister");
    free(reg);

    // ---- managed memory: one pointer on both sides ---------------------------------------
    int *m;
    CHECK(cudaMallocManaged(&m, n * sizeof(int)) == cudaSuccess, "managed alloc");
    for (int i = 0; i < n; i++) m[i] = 1;
    bump<<<(n + 255) / 256, 256>>>(m, n);
    cudaDeviceSynchronize();
    bad = 0;
    for (int i = 0; i < n; i++) bad += m[i] != 1 + i;
    CHECK(bad == 0, "managed after one kernel: %d wrong", bad);
    cudaStream_t s;
    cudaStreamCreate(&s);
    CHECK(cudaStreamAttachMemAsync(s, m, 0, cudaMemAttachSingle) == cudaSuccess, "attach");
    CHECK(cudaMemPrefetchAsync(m, n * sizeof(int), cudaMemLocation{cudaMemLocationTypeDevice, 0},
                               0, s) == cudaSuccess,
          "prefetch to the device");
    bump<<<(n + 255) / 256, 256, 0, s>>>(m, n);
    bump<<<(n + 255) / 256, 256, 0, s>>>(m, n);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "stream sync");
    bad = 0;
    for (int i = 0; i < n; i++) bad += m[i] != 1 + 3 * i;
    CHECK(bad == 0, "managed after three kernels: %d wrong", bad);
    // copies to and from managed memory, and memset
    int host[16];
    cudaMemcpy(host, m + 100, sizeof host, cudaMemcpyDefault);
    CHECK(host[0] == 301 && host[15] == 346, "copy out of managed: %d %d", host[0], host[15]);
    cudaMemset(m, 0, 64 * sizeof(int));
    cudaDeviceSynchronize();
    CHECK(m[0] == 0 && m[63] == 0 && m[64] == 193, "memset managed: %d %d %d", m[0], m[63],
          m[64]);
    // advice and range attributes
    CHECK(cudaMemAdvise(m, n * sizeof(int), cudaMemAdviseSetReadMostly,
                        cudaMemLocation{cudaMemLocationTypeDevice, 0}) == cudaSuccess,
          "advise");
    CHECK(cudaMemAdvise(m, n * sizeof(int), cudaMemAdviseSetPreferredLocation,
                        cudaMemLocation{cudaMemLocationTypeDevice, 0}) == cudaSuccess,
          "advise preferred");
    int rm = -5, loc = -5, last = -5;
    cudaMemRangeGetAttribute(&rm, 4, cudaMemRangeAttributeReadMostly, m, n * sizeof(int));
    cudaMemRangeGetAttribute(&loc, 4, cudaMemRangeAttributePreferredLocation, m, n * sizeof(int));
    cudaMemRangeGetAttribute(&last, 4, cudaMemRangeAttributeLastPrefetchLocation, m,
                             n * sizeof(int));
    CHECK(rm == 1 && loc == 0 && last == 0, "range attributes %d %d %d", rm, loc, last);
    CHECK(cudaPointerGetAttributes(&pa, m) == cudaSuccess && pa.type == cudaMemoryTypeManaged,
          "managed pointer type %d", (int)pa.type);
    // a linked list built by the host in managed memory, walked by the device
    Node *nodes;
    int *sum;
    cudaMallocManaged(&nodes, 100 * sizeof(Node));
    cudaMallocManaged(&sum, sizeof(int));
    for (int i = 0; i < 100; i++) nodes[i] = Node{i, i + 1 < 100 ? &nodes[i + 1] : nullptr};
    walk<<<1, 1>>>(nodes, sum);
    cudaDeviceSynchronize();
    CHECK(*sum == 4950, "list sum %d", *sum);
    CHECK(cudaFree(nodes) == cudaSuccess && cudaFree(sum) == cudaSuccess && cudaFree(m) ==
              cudaSuccess,
          "free managed");
    // errors a program can handle
    CHECK(cudaMallocManaged(&m, 16, 7) == cudaErrorInvalidValue, "bad attach flags");
    cudaGetLastError();
    int plain;
    CHECK(cudaMemPrefetchAsync(&plain, 4, cudaMemLocation{cudaMemLocationTypeDevice, 0}, 0, 0) ==
              cudaErrorInvalidValue,
          "prefetch of non-managed memory refused");
    cudaGetLastError();

    return finish();
}
