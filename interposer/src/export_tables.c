/* cuGetExportTable: the private tables CUDA 13's runtime requires of a driver (facts in
 * shared/reference/cuda-driver-shim-facts.md §1). All process-local: the integrity digest
 * covers these tables' own addresses, the pid and the calling thread. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "crane_cuda.h"
#include "md2.h"

CUresult cuDriverGetVersion(int *v);
CUresult cuDeviceGetCount(int *n);
CUresult cuDeviceGetUuid(void *uuid, int dev);
CUresult cuDeviceGetAttribute(int *v, int attr, int dev);

CUresult crane_c_cuCtxGetId_12000(void *ctx, unsigned long long *id);

/* A slot whose contract is not established: it refuses, and logs the call with the first six
 * argument registers (what a caller passed is the first clue to what it wants). */
typedef uintptr_t reg_t;
#define DARK(tbl, n)                                                                          \
    static CUresult dark_##tbl##_##n(reg_t a, reg_t b, reg_t c, reg_t d, reg_t e, reg_t f) { \
        crane_log("export table %s slot %d called (%#lx %#lx %#lx %#lx %#lx %#lx): "         \
                  "not supported", #tbl, n, (unsigned long)a, (unsigned long)b,             \
                  (unsigned long)c, (unsigned long)d, (unsigned long)e, (unsigned long)f);  \
        return CUDA_ERROR_NOT_SUPPORTED;                                                    \
    }

/* ---- CUDART_INTERFACE ---------------------------------------------------------------------- */
DARK(cudart, 1) DARK(cudart, 3) DARK(cudart, 4) DARK(cudart, 5) DARK(cudart, 6)
DARK(cudart, 7) DARK(cudart, 8) DARK(cudart, 9) DARK(cudart, 10) DARK(cudart, 11)

static CUresult cudart_primary_ctx(CUcontext *out, CUdevice dev) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = crane_primary_ctx(dev);
    if (!c) return CUDA_ERROR_INVALID_DEVICE;
    *out = c;  /* no reference taken: cudart retains it itself */
    return CUDA_SUCCESS;
}

/* [12] CUresult (void), called by cudart >= 13.2 once at init, right after
 * cuModuleGetLoadingMode, unless the environment holds CUDA_8b3537d1=dc6ffd77; any error fails
 * every runtime call after it (the error mapped to a runtime one: NOT_SUPPORTED gave 801). No
 * argument, no output. Public shims name it "load compilers": the driver readies its JIT
 * compilers. Crane's guest compiles nothing (PTX is JIT-ed by the daemon's device when a
 * module loads, and a failure is reported there), so there is nothing to ready. */
static CUresult cudart_load_compilers(void) {
    if (crane_trace_on) crane_log("export table cudart slot 12 (load compilers): nothing to load");
    return CUDA_SUCCESS;
}

static void *cudart_interface[13] = {
    (void *)(13 * sizeof(void *)), dark_cudart_1, cudart_primary_ctx, dark_cudart_3,
    dark_cudart_4, dark_cudart_5, dark_cudart_6, dark_cudart_7, dark_cudart_8, dark_cudart_9,
    dark_cudart_10, dark_cudart_11, cudart_load_compilers,
};

/* ---- TOOLS_RUNTIME_CALLBACK_HOOKS --------------------------------------------------------- */
static unsigned char hook_enable[1024], hook_enable_small[14];  /* all zero: no callbacks */
static void hooks_noop(void) {}
static void hooks_enable_buf(void **buf, size_t *size) { *buf = hook_enable; *size = sizeof hook_enable; }
static void hooks_enable_small(void **buf, size_t *size) {
    *buf = hook_enable_small;
    *size = sizeof hook_enable_small;
}
static void *tools_hooks[7] = {
    (void *)(7 * sizeof(void *)), hooks_noop, hooks_enable_buf, hooks_noop, hooks_noop,
    hooks_noop, hooks_enable_small,
};

/* ---- TOOLS_TLS ---------------------------------------------------------------------------- */
/* [2] CUresult (CUcontext *out): the calling thread's current context (NULL if none), as
 * cuCtxGetCurrent. cuBLASLt calls it before each GEMM (and at handle creation) and passes the
 * context to TOOLS_CONTEXT[4] (21318c60); an error made cuBLAS answer CUBLAS_STATUS_NOT_SUPPORTED. */
DARK(tls, 1) DARK(tls, 3)
static CUresult tls_current_ctx(CUcontext *out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    *out = crane_ctx_current();
    return CUDA_SUCCESS;
}
static void *tools_tls[4] = {(void *)(4 * sizeof(void *)), dark_tls_1, tls_current_ctx, dark_tls_3};

/* ---- TOOLS_CONTEXT (21318c60) ------------------------------------------------------------ */
/* cuFFT asks for it with TOOLS_MODULE and takes neither if either is missing (every plan then
 * failed with CUFFT_INTERNAL_ERROR); cudart 13.5 fails its initialization without it (500 from
 * every call) but calls no slot; cuBLAS and cuBLASLt call [4], [39] and [51]. The driver's table
 * is longer: the size word says these 52 words, so a caller that checks it for a later slot
 * sees that slot absent. */
CUresult cuStreamGetId(void *stream, unsigned long long *id);

/* [51] CUresult (CUcontext ctx, CUstream stream, void **out): cuBLAS, before each call that
 * launches, with the handle's stream (0 for the default one; it tests for 2, the per-thread
 * stream, itself). The output is opaque to it: it only passes it to [39]. Here it is the
 * stream handle itself. */
static CUresult tools_ctx_stream(CUcontext ctx, void *stream, void **out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    if (!ctx && !crane_ctx_current()) return CUDA_ERROR_INVALID_CONTEXT;
    *out = stream;
    return CUDA_SUCCESS;
}

/* [39] CUresult (CUcontext ctx, void *stream_from_51, unsigned long long *out): the key under
 * which cuBLAS caches per-stream state (it compares it with the keys it holds), so it must
 * tell streams apart and stay the same for one stream: the stream's unique id
 * (cuStreamGetId, which also refuses an unknown handle). */
static CUresult tools_ctx_stream_id(CUcontext ctx, void *stream, unsigned long long *out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    if (!ctx && !crane_ctx_current()) return CUDA_ERROR_INVALID_CONTEXT;
    return cuStreamGetId(stream, out);
}

DARK(ctx, 1) DARK(ctx, 2) DARK(ctx, 3) DARK(ctx, 5) DARK(ctx, 6) DARK(ctx, 7) DARK(ctx, 8)
DARK(ctx, 9) DARK(ctx, 10) DARK(ctx, 11) DARK(ctx, 12) DARK(ctx, 13) DARK(ctx, 14) DARK(ctx, 15)
DARK(ctx, 16) DARK(ctx, 17) DARK(ctx, 18) DARK(ctx, 19) DARK(ctx, 20) DARK(ctx, 21) DARK(ctx, 22)
DARK(ctx, 23) DARK(ctx, 24) DARK(ctx, 25) DARK(ctx, 26) DARK(ctx, 27) DARK(ctx, 28) DARK(ctx, 29)
DARK(ctx, 30) DARK(ctx, 31) DARK(ctx, 32) DARK(ctx, 33) DARK(ctx, 34) DARK(ctx, 35) DARK(ctx, 36)
DARK(ctx, 37) DARK(ctx, 38) DARK(ctx, 40) DARK(ctx, 41) DARK(ctx, 42) DARK(ctx, 43) DARK(ctx, 44)
DARK(ctx, 45) DARK(ctx, 46) DARK(ctx, 47) DARK(ctx, 48) DARK(ctx, 49) DARK(ctx, 50)
/* [4] CUresult (CUcontext ctx, unsigned long long *id) is cuCtxGetId: cuBLASLt passes it
 * TOOLS_TLS[2]'s context and keys its kernel registry by the id; cuFFT calls it too. */
static void *tools_context[52] = {
    (void *)(52 * sizeof(void *)), dark_ctx_1, dark_ctx_2, dark_ctx_3, crane_c_cuCtxGetId_12000,
    dark_ctx_5, dark_ctx_6, dark_ctx_7, dark_ctx_8, dark_ctx_9, dark_ctx_10, dark_ctx_11,
    dark_ctx_12, dark_ctx_13, dark_ctx_14, dark_ctx_15, dark_ctx_16, dark_ctx_17, dark_ctx_18,
    dark_ctx_19, dark_ctx_20, dark_ctx_21, dark_ctx_22, dark_ctx_23, dark_ctx_24, dark_ctx_25,
    dark_ctx_26, dark_ctx_27, dark_ctx_28, dark_ctx_29, dark_ctx_30, dark_ctx_31, dark_ctx_32,
    dark_ctx_33, dark_ctx_34, dark_ctx_35, dark_ctx_36, dark_ctx_37, dark_ctx_38,
    tools_ctx_stream_id, dark_ctx_40, dark_ctx_41, dark_ctx_42, dark_ctx_43, dark_ctx_44,
    dark_ctx_45, dark_ctx_46, dark_ctx_47, dark_ctx_48, dark_ctx_49, dark_ctx_50,
    tools_ctx_stream,
};

/* ---- TOOLS_MODULE (6e163fbe) -------------------------------------------------------------- */
/* [7] int (CUcontext ctx, CUmodule mod, void (*visit)(void *user, CUfunction f), void *user):
 * calls visit once per function of the module and returns how many it visited. cuFFT loads
 * each of its kernels as a module of one function and finds the function this way (its
 * visitor stores f at user), accepting only the answer 1; whether the driver answers a count
 * or a found-flag for modules of several functions is not established. Words 1-6 are DARK;
 * cuFFT checks that the size word covers [7] before calling it. */
CUresult cuModuleGetFunctionCount(unsigned *count, void *mod);
CUresult cuModuleEnumerateFunctions(void **functions, unsigned n, void *mod);

static int tools_module_visit(CUcontext ctx, void *mod, void (*visit)(void *, void *), void *user) {
    unsigned n = 0;
    if (!visit || (!ctx && !crane_ctx_current()) || cuModuleGetFunctionCount(&n, mod) || !n)
        return 0;
    void **fns = calloc(n, sizeof *fns);
    if (!fns) return 0;
    int visited = 0;
    if (!cuModuleEnumerateFunctions(fns, n, mod))
        for (unsigned i = 0; i < n; i++, visited++) visit(user, fns[i]);
    free(fns);
    return visited;
}

DARK(module, 1) DARK(module, 2) DARK(module, 3) DARK(module, 4) DARK(module, 5) DARK(module, 6)
static void *tools_module[8] = {
    (void *)(8 * sizeof(void *)), dark_module_1, dark_module_2, dark_module_3, dark_module_4,
    dark_module_5, dark_module_6, tools_module_visit,
};

/* ---- CONTEXT_LOCAL_STORAGE_INTERFACE_V0301 (no size word) -------------------------------- */
CUresult crane_cls_put(CUcontext, void *, void *, void (*)(CUcontext, void *, void *));
CUresult crane_cls_delete(CUcontext, void *);
CUresult crane_cls_get(void **, CUcontext, void *);
DARK(cls, 3)
static void *context_local_storage[4] = {crane_cls_put, crane_cls_delete, crane_cls_get, dark_cls_3};

/* ---- CONTEXT_CHECKS ----------------------------------------------------------------------- */
DARK(checks, 1)
static CUresult checks_attach(CUcontext ctx, uint32_t *out1, void **out2) {
    (void)ctx;
    if (out1) *out1 = 0;
    if (out2) *out2 = NULL;
    return CUDA_SUCCESS;
}
static uint32_t checks_init(void) { return 0; }
static void *context_checks[4] = {(void *)(4 * sizeof(void *)), dark_checks_1, checks_attach, checks_init};

/* ---- INTEGRITY_CHECK ---------------------------------------------------------------------- */
static const unsigned char hmac_key[16] = {0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52,
                                           0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f};
static CUresult integrity_check(uint32_t version, uint64_t unix_seconds, uint64_t out[2]);
DARK(integrity, 2)
static void *integrity_table[3] = {(void *)(3 * sizeof(void *)), integrity_check, dark_integrity_2};

static void put32(unsigned char **p, uint32_t v) { memcpy(*p, &v, 4); *p += 4; }
static void put64(unsigned char **p, uint64_t v) { memcpy(*p, &v, 8); *p += 8; }

static CUresult integrity_check(uint32_t version, uint64_t unix_seconds, uint64_t out[2]) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    if (version % 10 == 0) {
        out[0] = 0x3341181c03cb675cull;
        out[1] = 0x8ed383aa1f4cd1e8ull;
        return CUDA_SUCCESS;
    }
    if (version % 10 == 1) {
        out[0] = 0x1841181c03cb675cull;
        out[1] = 0x8ed383aa1f4cd1e8ull;
        return CUDA_SUCCESS;
    }
    int drv = 0, count = 0;
    CUresult r = cuDriverGetVersion(&drv);
    if (!r) r = cuDeviceGetCount(&count);
    if (r) return r;
    if (count > CRANE_MAX_DEVICES) count = CRANE_MAX_DEVICES;
    unsigned char msg[48 + 28 * CRANE_MAX_DEVICES], *p = msg;
    put32(&p, (uint32_t)drv);
    put32(&p, version);
    put32(&p, (uint32_t)getpid());
    put32(&p, (uint32_t)(uintptr_t)pthread_self());
    put64(&p, (uint64_t)(uintptr_t)cudart_interface);
    put64(&p, (uint64_t)(uintptr_t)integrity_table);
    put64(&p, (uint64_t)(uintptr_t)integrity_table[1]);
    put64(&p, unix_seconds);
    for (int dev = 0; dev < count; dev++) {
        int dom = 0, bus = 0, pdev = 0;
        if ((r = cuDeviceGetUuid(p, dev))) return r;
        p += 16;
        if ((r = cuDeviceGetAttribute(&dom, 50, dev)) || (r = cuDeviceGetAttribute(&bus, 33, dev)) ||
            (r = cuDeviceGetAttribute(&pdev, 34, dev)))
            return r;
        put32(&p, (uint32_t)dom);
        put32(&p, (uint32_t)bus);
        put32(&p, (uint32_t)pdev);
    }
    unsigned char digest[16];
    if (crane_hmac_md2(hmac_key, msg, (size_t)(p - msg), digest)) return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(out, digest, 16);
    return CUDA_SUCCESS;
}

/* ---- tables served with every slot refusing -----------------------------------------------
 * Some callers take a table for granted: they dereference what cuGetExportTable wrote without
 * checking its result, so refusing the table crashes them, while they do check what its slots
 * answer. Such a table is served as 63 DARK slots (word 0: the size), each refusing with
 * NOT_SUPPORTED and logging its call.
 * - 1734dc26-800d-4745-8726-c0f1e7dd8bca: cuBLASLt 13.x asks for it before its first Hopper
 *   half-precision GEMM on an H100 (torch 2.11, `a.half() @ b.half()`): refused, the process
 *   died of SIGSEGV; served so, it called slot 4 (two stack pointers, the context, 0, 6, 0)
 *   once, took the refusal and computed the right product (observed on the H100, driver 580).
 * - With CRANE_PROBE_EXPORT_TABLES=1 (a diagnostic), every unknown table is served so, to see
 *   which slots a caller uses and with what; by default an unknown table is refused, as a
 *   driver without it refuses. */
DARK(any, 1) DARK(any, 2) DARK(any, 3) DARK(any, 4) DARK(any, 5) DARK(any, 6) DARK(any, 7)
DARK(any, 8) DARK(any, 9) DARK(any, 10) DARK(any, 11) DARK(any, 12) DARK(any, 13) DARK(any, 14)
DARK(any, 15) DARK(any, 16) DARK(any, 17) DARK(any, 18) DARK(any, 19) DARK(any, 20) DARK(any, 21)
DARK(any, 22) DARK(any, 23) DARK(any, 24) DARK(any, 25) DARK(any, 26) DARK(any, 27) DARK(any, 28)
DARK(any, 29) DARK(any, 30) DARK(any, 31) DARK(any, 32) DARK(any, 33) DARK(any, 34) DARK(any, 35)
DARK(any, 36) DARK(any, 37) DARK(any, 38) DARK(any, 39) DARK(any, 40) DARK(any, 41) DARK(any, 42)
DARK(any, 43) DARK(any, 44) DARK(any, 45) DARK(any, 46) DARK(any, 47) DARK(any, 48) DARK(any, 49)
DARK(any, 50) DARK(any, 51) DARK(any, 52) DARK(any, 53) DARK(any, 54) DARK(any, 55) DARK(any, 56)
DARK(any, 57) DARK(any, 58) DARK(any, 59) DARK(any, 60) DARK(any, 61) DARK(any, 62) DARK(any, 63)
static void *refusing_table[64] = {
    (void *)(64 * sizeof(void *)),
    dark_any_1, dark_any_2, dark_any_3, dark_any_4, dark_any_5, dark_any_6, dark_any_7, dark_any_8,
    dark_any_9, dark_any_10, dark_any_11, dark_any_12, dark_any_13, dark_any_14, dark_any_15,
    dark_any_16, dark_any_17, dark_any_18, dark_any_19, dark_any_20, dark_any_21, dark_any_22,
    dark_any_23, dark_any_24, dark_any_25, dark_any_26, dark_any_27, dark_any_28, dark_any_29,
    dark_any_30, dark_any_31, dark_any_32, dark_any_33, dark_any_34, dark_any_35, dark_any_36,
    dark_any_37, dark_any_38, dark_any_39, dark_any_40, dark_any_41, dark_any_42, dark_any_43,
    dark_any_44, dark_any_45, dark_any_46, dark_any_47, dark_any_48, dark_any_49, dark_any_50,
    dark_any_51, dark_any_52, dark_any_53, dark_any_54, dark_any_55, dark_any_56, dark_any_57,
    dark_any_58, dark_any_59, dark_any_60, dark_any_61, dark_any_62, dark_any_63
};

/* ---- look-up ------------------------------------------------------------------------------ */
/* Tables deliberately not provided (CUDA_ERROR_NOT_FOUND, as a driver without them answers),
 * because no caller was seen needing them and no contract could be established:
 *   f8cff951-2146-8b4e-b9e2-fb469e7c0dd9: asked first by every cudart (13.0, 13.2, 13.5, static
 *     or shared, and the ones inside cuBLAS/cuFFT); a 37-word table of logging slots was served
 *     in an experiment and none of its slots was called, and refusing it costs nothing.
 *   da9151d3-3ae6-cc41-a5c0-4f26d533e328: asked by NVRTC 13.2; served, its [1] was called with
 *     (pointer, 2, pointer, 0x7bc, ...) and NVRTC compiled the same after NOT_SUPPORTED there,
 *     as it does when the table is missing. */
struct table { unsigned char uuid[16]; void **words; const char *name; };
static const struct table tables[] = {
    {{0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9},
     cudart_interface, "CUDART_INTERFACE"},
    {{0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66},
     tools_hooks, "TOOLS_RUNTIME_CALLBACK_HOOKS"},
    {{0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc},
     tools_tls, "TOOLS_TLS"},
    {{0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93},
     context_local_storage, "CONTEXT_LOCAL_STORAGE_INTERFACE_V0301"},
    {{0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e},
     context_checks, "CONTEXT_CHECKS"},
    {{0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2},
     integrity_table, "INTEGRITY_CHECK"},
    {{0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2},
     tools_context, "TOOLS_CONTEXT"},
    {{0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d, 0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1, 0x99, 0x1e},
     tools_module, "TOOLS_MODULE"},
    {{0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca},
     refusing_table, "1734dc26 (cuBLASLt, every slot refusing)"},
};

int crane_c_cuGetExportTable_3000(const void **ppExportTable, void *pExportTableId) {
    if (!ppExportTable || !pExportTableId) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
        if (!memcmp(tables[i].uuid, pExportTableId, 16)) {
            *ppExportTable = tables[i].words;
            return CUDA_SUCCESS;
        }
    if (crane_trace_on) {
        const unsigned char *u = pExportTableId;
        crane_log("export table %02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x "
                  "not provided", u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10],
                  u[11], u[12], u[13], u[14], u[15]);
    }
    const char *probe = getenv("CRANE_PROBE_EXPORT_TABLES");
    if (probe && *probe == '1') {
        const unsigned char *u = pExportTableId;
        crane_log("export table %02x%02x%02x%02x-...: probing (63 logging slots)", u[0], u[1], u[2], u[3]);
        *ppExportTable = refusing_table;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_NOT_FOUND;
}
