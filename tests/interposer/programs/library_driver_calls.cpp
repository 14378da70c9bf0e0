// The driver calls NVIDIA's libraries make beyond the runtime's: the export-table slots cuBLAS,
// cuBLASLt, cuFFT and cudart 13.2+ call, each checked against the public call it stands for,
// and what cublasCreate asks of a device it has SASS for (the CIG limit, kernel attributes for
// large dynamic shared memory and non-portable cluster sizes, cluster occupancy). Driver API,
// linked with -lcuda; a library of two kernels is loaded from PTX text.
#include <cstdio>
#include <cstring>
#include <cuda.h>
#include "check.h"

static const char *PTX = R"(
.version 8.0
.target sm_80
.address_size 64
.visible .entry first(.param .u64 p) {
    .reg .u64 %rd<2>;
    ld.param.u64 %rd0, [p];
    cvta.to.global.u64 %rd1, %rd0;
    st.global.u32 [%rd1], 11;
    ret;
}
.visible .entry second(.param .u64 q) {
    .reg .u64 %rd<3>;
    .reg .u32 %r<2>;
    ld.param.u64 %rd0, [q];
    mov.u32 %r0, 20;
    add.u32 %r1, %r0, 2;
    st.global.u32 [%rd0], %r1;
    ret;
}
)";

typedef CUresult (*tls_ctx_t)(CUcontext *);
typedef CUresult (*ctx_id_t)(CUcontext, unsigned long long *);
typedef CUresult (*ctx_stream_t)(CUcontext, CUstream, void **);
typedef CUresult (*stream_key_t)(CUcontext, void *, unsigned long long *);
typedef int (*visit_t)(CUcontext, CUmodule, void (*)(void *, void *), void *);

static void **table(const unsigned char (&id)[16]) {
    const void *t = nullptr;
    CUuuid u;
    memcpy(u.bytes, id, 16);
    CUresult r = cuGetExportTable(&t, &u);
    CHECK(r == CUDA_SUCCESS && t, "cuGetExportTable %02x%02x: %d", id[0], id[1], int(r));
    return (void **)t;
}

static const unsigned char TOOLS_TLS[16] = {0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47,
                                            0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc};
static const unsigned char TOOLS_CONTEXT[16] = {0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48,
                                                0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2};
static const unsigned char TOOLS_MODULE[16] = {0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d,
                                               0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1, 0x99, 0x1e};
// cuBLASLt dereferences it unchecked before its Hopper half-precision GEMMs, then takes a
// refusal from its slot 4 (observed on an H100): served with every slot refusing
static const unsigned char CUBLASLT_1734[16] = {0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45,
                                                0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca};
typedef CUresult (*slot6_t)(void *, void *, void *, void *, void *, void *);

static int visits;
static void remember(void *user, void *fn) {
    *(void **)user = fn;
    visits++;
}

int main() {
    CHECK(cuInit(0) == CUDA_SUCCESS, "cuInit");
    unsigned long long id = 0, id2 = 0;
    // cuCtxGetId: no current context yet
    CHECK(cuCtxGetId(nullptr, &id) == CUDA_ERROR_INVALID_CONTEXT, "cuCtxGetId without a context");
    void **tls = table(TOOLS_TLS), **tc = table(TOOLS_CONTEXT), **tm = table(TOOLS_MODULE);
    CHECK((size_t)tls[0] >= 3 * sizeof(void *), "TOOLS_TLS size %zu", (size_t)tls[0]);
    CHECK((size_t)tc[0] >= 52 * sizeof(void *), "TOOLS_CONTEXT size %zu", (size_t)tc[0]);
    CHECK((size_t)tm[0] >= 8 * sizeof(void *), "TOOLS_MODULE size %zu", (size_t)tm[0]);
    void **lt = table(CUBLASLT_1734);
    CHECK((size_t)lt[0] >= 5 * sizeof(void *), "1734dc26 size %zu", (size_t)lt[0]);
    int stack[4];
    CHECK(((slot6_t)lt[4])(&stack[0], &stack[2], nullptr, nullptr, (void *)6, nullptr) ==
              CUDA_ERROR_NOT_SUPPORTED,
          "1734dc26 slot 4 refuses");
    CUcontext cur = (CUcontext)1;
    CHECK(((tls_ctx_t)tls[2])(&cur) == CUDA_SUCCESS && cur == nullptr, "TLS[2] without a context");

    CUcontext primary, created;
    CHECK(cuDevicePrimaryCtxRetain(&primary, 0) == CUDA_SUCCESS, "retain");
    CHECK(cuCtxSetCurrent(primary) == CUDA_SUCCESS, "set current");
    CHECK(((tls_ctx_t)tls[2])(&cur) == CUDA_SUCCESS && cur == primary, "TLS[2] is the current");
    CHECK(cuCtxGetId(nullptr, &id) == CUDA_SUCCESS && id != 0, "cuCtxGetId current");
    CHECK(cuCtxGetId(primary, &id2) == CUDA_SUCCESS && id2 == id, "cuCtxGetId stable");
    CHECK(((ctx_id_t)tc[4])(primary, &id2) == CUDA_SUCCESS && id2 == id, "TOOLS_CONTEXT[4]");
    CHECK(cuCtxCreate(&created, nullptr, 0, 0) == CUDA_SUCCESS, "cuCtxCreate");
    CHECK(cuCtxGetId(created, &id2) == CUDA_SUCCESS && id2 != id, "created context's id %llu", id2);
    CHECK(((tls_ctx_t)tls[2])(&cur) == CUDA_SUCCESS && cur == created, "TLS[2] after create");
    CHECK(cuCtxDestroy(created) == CUDA_SUCCESS, "destroy");
    CHECK(cuCtxSetCurrent(primary) == CUDA_SUCCESS, "set current");

    // TOOLS_CONTEXT[51] then [39]: a key per stream, the stream's id
    CUstream s1, s2;
    CHECK(cuStreamCreate(&s1, 0) == CUDA_SUCCESS && cuStreamCreate(&s2, 0) == CUDA_SUCCESS,
          "streams");
    unsigned long long k0 = 0, k1 = 0, k2 = 0, sid = 0;
    void *tok = nullptr;
    CHECK(((ctx_stream_t)tc[51])(primary, s1, &tok) == CUDA_SUCCESS, "[51] s1");
    CHECK(((stream_key_t)tc[39])(primary, tok, &k1) == CUDA_SUCCESS, "[39] s1");
    CHECK(cuStreamGetId(s1, &sid) == CUDA_SUCCESS && sid == k1, "[39] is s1's id");
    CHECK(((ctx_stream_t)tc[51])(primary, s2, &tok) == CUDA_SUCCESS, "[51] s2");
    CHECK(((stream_key_t)tc[39])(primary, tok, &k2) == CUDA_SUCCESS && k2 != k1, "[39] s2");
    CHECK(((ctx_stream_t)tc[51])(primary, nullptr, &tok) == CUDA_SUCCESS, "[51] default");
    CHECK(((stream_key_t)tc[39])(primary, tok, &k0) == CUDA_SUCCESS && k0 != k1 && k0 != k2,
          "[39] default stream");

    // TOOLS_MODULE[7]: visits each function of a module and returns how many
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, PTX) == CUDA_SUCCESS, "load");
    unsigned count = 0;
    CHECK(cuModuleGetFunctionCount(&count, mod) == CUDA_SUCCESS && count == 2, "count %u", count);
    CUfunction fns[2] = {nullptr, nullptr};
    CHECK(cuModuleEnumerateFunctions(fns, 2, mod) == CUDA_SUCCESS, "enumerate");
    CHECK(cuModuleEnumerateFunctions(fns, 3, mod) == CUDA_ERROR_INVALID_VALUE, "enumerate 3 of 2");
    void *last = nullptr;
    int n = ((visit_t)tm[7])(primary, mod, remember, &last);
    CHECK(n == 2 && visits == 2, "visited %d (%d calls)", n, visits);
    const char *name0 = nullptr, *name1 = nullptr;
    CHECK(cuFuncGetName(&name0, fns[0]) == CUDA_SUCCESS && cuFuncGetName(&name1, fns[1]) == 0,
          "names");
    CHECK(name0 && name1 && !strcmp(name0, "first") && !strcmp(name1, "second"), "names %s %s",
          name0 ? name0 : "-", name1 ? name1 : "-");
    // the functions enumerated are launchable
    CUdeviceptr out;
    CHECK(cuMemAlloc(&out, 4) == CUDA_SUCCESS, "alloc");
    void *params[] = {&out};
    CHECK(cuLaunchKernel(fns[1], 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr) == 0, "launch");
    unsigned v = 0;
    CHECK(cuMemcpyDtoH(&v, out, 4) == CUDA_SUCCESS && v == 22, "second wrote %u", v);
    printf("ctx_id=%llu streams_distinct=%d module_functions=%d stored=%d\n", id,
           k0 != k1 && k1 != k2, n, last == (void *)fns[1]);

    // cublasCreate at compute capability 9.0 / 12.0: the limit must be answered (0: not a CIG
    // context), and the cluster attributes and occupancy served
    size_t cig = 7;
    CHECK(cuCtxGetLimit(&cig, CU_LIMIT_CIG_ENABLED) == CUDA_SUCCESS && cig == 0, "CIG %zu", cig);
    CUlibrary lib;
    CUkernel kern;
    CHECK(cuLibraryLoadData(&lib, PTX, nullptr, nullptr, 0, nullptr, nullptr, 0) == 0, "lib");
    CHECK(cuLibraryGetKernel(&kern, lib, "first") == CUDA_SUCCESS, "kernel");
    CHECK(cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 200 * 1024, kern,
                               0) == CUDA_SUCCESS,
          "dynamic shared size");
    CHECK(cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1, kern, 0) ==
              CUDA_SUCCESS,
          "non-portable cluster size");
    CUfunction kfn;
    CHECK(cuKernelGetFunction(&kfn, kern) == CUDA_SUCCESS, "kernel function");
    // occupancy formulas (cuBLAS's) divide by the registers a warp uses: never 0, and a share
    // of the register file that agrees with the occupancy the driver reports
    int regs = 0, regs_sm = 0, threads_sm = 0, blocks = 0;
    CHECK(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, kfn) == CUDA_SUCCESS, "regs");
    cuDeviceGetAttribute(&regs_sm, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 0);
    cuDeviceGetAttribute(&threads_sm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 0);
    CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kfn, 256, 0) == 0, "occupancy");
    CHECK(regs > 0 && blocks * 256 * regs <= regs_sm && blocks * 256 == threads_sm,
          "regs %d x %d blocks of 256 in %d registers, %d threads", regs, blocks, regs_sm,
          threads_sm);
    CUlaunchAttribute cl;
    cl.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    cl.value.clusterDim.x = 16;
    cl.value.clusterDim.y = cl.value.clusterDim.z = 1;
    CUlaunchConfig cfg = {};
    cfg.gridDimX = 32;
    cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 128;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.attrs = &cl;
    cfg.numAttrs = 1;
    int clusters = 0;
    CHECK(cuOccupancyMaxActiveClusters(&clusters, kfn, &cfg) == CUDA_SUCCESS && clusters > 0,
          "clusters of 16: %d", clusters);
    CHECK(cuLaunchKernelEx(&cfg, kfn, params, nullptr) == CUDA_SUCCESS, "cluster launch");
    CHECK(cuMemcpyDtoH(&v, out, 4) == CUDA_SUCCESS && v == 11, "first wrote %u", v);
    printf("cig=%zu non_portable_clusters=%d regs_ok=%d\n", cig, clusters > 0, regs > 0);
    CHECK(cuLibraryUnload(lib) == CUDA_SUCCESS, "unload");

    // a reset makes a new primary context behind the same handle: a new id
    CHECK(cuDevicePrimaryCtxReset(0) == CUDA_SUCCESS, "reset");
    CHECK(cuDevicePrimaryCtxRetain(&primary, 0) == CUDA_SUCCESS, "retain again");
    CHECK(cuCtxSetCurrent(primary) == CUDA_SUCCESS, "set current");
    CHECK(cuCtxGetId(primary, &id2) == CUDA_SUCCESS && id2 != id, "id after reset %llu", id2);
    return finish();
}
