// The CUDA virtual memory management API: reserve an address range at a hint, back it with two
// physical allocations, set access, copy in, run a kernel through the mapping (across the
// boundary between the two allocations), copy out, move a handle to another address, tear
// everything down in both orders; then the error cases. Each line is checked by the test.
#include <cstdio>
#include <cstring>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

__global__ void scale(int *p, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = p[i] * k + i;
}

static const char *name(CUresult r) {
    const char *s = "?";
    cuGetErrorName(r, &s);
    return s;
}

#define CK(x)                                                                     \
    do {                                                                          \
        CUresult r_ = (x);                                                        \
        if (r_ != CUDA_SUCCESS) {                                                 \
            printf("FAIL line %d: %s = %s\n", __LINE__, #x, name(r_));            \
            return 1;                                                             \
        }                                                                         \
    } while (0)

int main() {
    cudaFree(0);  // the primary context, current on this thread
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0, rec = 0;
    CK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CK(cuMemGetAllocationGranularity(&rec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    printf("granularity min=%zu rec=%zu\n", g, rec);

    // device memory lives in the session's window: ask for a range well inside it
    CUdeviceptr probe;
    CK(cuMemAlloc(&probe, 256));
    size_t free0, total;
    CK(cuMemGetInfo(&free0, &total));
    CUdeviceptr hint = (probe + (64ull << 30)) / g * g;
    CUdeviceptr base;
    CK(cuMemAddressReserve(&base, 4 * g, 0, hint, 0));
    CUdeviceptr other;  // the same hint again is taken: the driver picks another range
    CK(cuMemAddressReserve(&other, 2 * g, 0, hint, 0));
    printf("reserve at_hint=%d other_elsewhere=%d\n", base == hint,
           other != hint && (other + 2 * g <= base || other >= base + 4 * g));
    CK(cuMemAddressFree(other, 2 * g));

    CUmemGenericAllocationHandle h1, h2;
    CK(cuMemCreate(&h1, g, &prop, 0));
    CK(cuMemCreate(&h2, g, &prop, 0));
    CK(cuMemMap(base, g, 0, h1, 0));
    CK(cuMemMap(base + g, g, 0, h2, 0));
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemSetAccess(base, 2 * g, &acc, 1));
    unsigned long long flags = 0;
    CK(cuMemGetAccess(&flags, &prop.location, base + g + 8));

    // one copy over both mappings, a kernel over both, one copy back
    int n = (int)(2 * g / sizeof(int));
    std::vector<int> h(n), out(n);
    for (int i = 0; i < n; i++) h[i] = i % 1000;
    CK(cuMemcpyHtoD(base, h.data(), 2 * g));
    scale<<<(n + 255) / 256, 256>>>((int *)base, n, 3);
    cudaError_t ke = cudaDeviceSynchronize();
    CK(cuMemcpyDtoH(out.data(), base, 2 * g));
    int bad = 0;
    for (int i = 0; i < n; i++) bad += out[i] != h[i] * 3 + i;
    printf("kernel %s flags=%llu bad=%d last=%d\n", cudaGetErrorName(ke), flags, bad, out[n - 1]);

    // a memset and a device-to-device copy across the boundary
    CK(cuMemsetD32(base + g - 8, 7, 4));
    CUdeviceptr scratch;
    CK(cuMemAlloc(&scratch, 64));
    CK(cuMemcpyDtoD(scratch, base + g - 8, 16));
    int four[4];
    CK(cuMemcpyDtoH(four, scratch, 16));
    printf("memset %d %d %d %d\n", four[0], four[1], four[2], four[3]);

    // what the driver says about the memory
    CUdeviceptr pb;
    size_t ps;
    CK(cuMemGetAddressRange(&pb, &ps, base + g + 100));
    unsigned int mt = 0;
    CK(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, base + g + 4));
    CUmemAllocationProp got;
    CK(cuMemGetAllocationPropertiesFromHandle(&got, h2));
    CUmemGenericAllocationHandle again;
    CK(cuMemRetainAllocationHandle(&again, (void *)(base + g + 4)));
    CK(cuMemRelease(again));
    printf("range ok=%d memtype=%u prop_ok=%d retain_ok=%d\n", pb == base + g && ps == g, mt,
           got.type == CU_MEM_ALLOCATION_TYPE_PINNED && got.location.id == 0, again == h2);

    // unmapped but not released: the handle keeps its contents and maps elsewhere
    CK(cuMemUnmap(base, g));
    CK(cuMemMap(base + 2 * g, g, 0, h1, 0));
    CK(cuMemSetAccess(base + 2 * g, g, &acc, 1));
    CK(cuMemcpyDtoH(out.data(), base + 2 * g, g));
    bad = 0;
    int m = (int)(g / sizeof(int));
    for (int i = 0; i < m; i++) bad += out[i] != (i < m - 2 ? h[i] * 3 + i : 7);  // memset tail
    printf("remap bad=%d\n", bad);

    // errors
    CUdeviceptr x;
    CUmemGenericAllocationHandle h3, h4, hx;
    CK(cuMemCreate(&h3, g, &prop, 0));
    CK(cuMemCreate(&h4, 2 * g, &prop, 0));
    CUmemAllocationProp dev1 = prop;
    dev1.location.id = 1;
    CUmemAccessDesc acc1 = acc;
    acc1.location.id = 1;
    size_t gx;
    printf("reserve_unaligned=%s\n", name(cuMemAddressReserve(&x, g + 4096, 0, 0, 0)));
    printf("create_unaligned=%s\n", name(cuMemCreate(&hx, g + 4096, &prop, 0)));
    printf("create_dev1=%s\n", name(cuMemCreate(&hx, g, &dev1, 0)));
    printf("granularity_dev1=%s\n", name(cuMemGetAllocationGranularity(&gx, &dev1,
                                                                    CU_MEM_ALLOC_GRANULARITY_MINIMUM)));
    printf("map_outside=%s\n", name(cuMemMap(base + 4 * g, g, 0, h3, 0)));
    printf("map_double=%s\n", name(cuMemMap(base + g, g, 0, h3, 0)));
    printf("map_alias=%s\n", name(cuMemMap(base, g, 0, h1, 0)));
    printf("map_unaligned=%s\n", name(cuMemMap(base, g / 2, 0, h3, 0)));
    printf("map_partial=%s\n", name(cuMemMap(base, g, 0, h4, 0)));
    printf("access_unmapped=%s\n", name(cuMemSetAccess(base, g, &acc, 1)));
    printf("access_dev1=%s\n", name(cuMemSetAccess(base + g, g, &acc1, 1)));
    printf("unmap_partial=%s\n", name(cuMemUnmap(base + g, g / 2)));
    printf("free_vmm=%s\n", name(cuMemFree(base + g)));
    printf("address_free_mapped=%s\n", name(cuMemAddressFree(base, 4 * g)));
    int fd = -1;
    printf("export=%s\n",
           name(cuMemExportToShareableHandle(&fd, h2, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)));

    // teardown in both orders: release then unmap, unmap then release
    CK(cuMemRelease(h2));
    CK(cuMemUnmap(base + g, g));
    CK(cuMemUnmap(base + 2 * g, g));
    CK(cuMemRelease(h1));
    CK(cuMemRelease(h3));
    CK(cuMemRelease(h4));
    CK(cuMemAddressFree(base, 4 * g));
    CK(cuMemFree(scratch));
    size_t free1;
    CK(cuMemGetInfo(&free1, &total));
    printf("teardown freed=%d\n", free1 == free0);
    printf("done\n");
    return 0;
}
