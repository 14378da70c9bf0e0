/* The current context (a per-thread stack, as CUDA defines it) and the primary contexts.
 *
 * Both are purely local (architecture invariant 3): cudart queries the current context around
 * nearly every runtime call, and uses the primary-context handle before it retains it, so the
 * handle is the address of a local object and the remote context behind it is made lazily by
 * the Python side. */
#include <pthread.h>
#include <stdint.h>

#include "crane_cuda.h"
#include "../generated/impl.h"

int crane_py_primary_reset(int dev);

#define STACK_MAX 64
static __thread CUcontext stack[STACK_MAX];
static __thread int depth;
static __thread int ptds_depth;

struct primary { int refs; unsigned flags; };
static struct primary primaries[CRANE_MAX_DEVICES];
static pthread_mutex_t prim_lock = PTHREAD_MUTEX_INITIALIZER;

CUcontext crane_ctx_current(void) { return depth ? stack[depth - 1] : NULL; }
void crane_ptds_enter(void) { ptds_depth++; }
void crane_ptds_leave(void) { ptds_depth--; }
int crane_in_ptds(void) { return ptds_depth > 0; }

CUcontext crane_primary_ctx(int dev) {
    return dev >= 0 && dev < CRANE_MAX_DEVICES ? (CUcontext)&primaries[dev] : NULL;
}

int crane_primary_dev(CUcontext ctx) {
    for (int i = 0; i < CRANE_MAX_DEVICES; i++)
        if (ctx == (CUcontext)&primaries[i]) return i;
    return -1;
}

/* Called by the Python side when a created context is destroyed: drop it from this thread's
 * stack (CUDA leaves other threads' stacks dangling too). */
void crane_ctx_forget(CUcontext ctx) {
    for (int i = 0; i < depth; i++)
        if (stack[i] == ctx) {
            for (int j = i; j < depth - 1; j++) stack[j] = stack[j + 1];
            depth--;
            i--;
        }
}

int crane_c_cuCtxGetCurrent_4000(void **pctx) {
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = crane_ctx_current();
    return CUDA_SUCCESS;
}

int crane_c_cuCtxSetCurrent_4000(void *ctx) {
    if (!ctx) {
        if (depth) depth--;
        return CUDA_SUCCESS;
    }
    if (depth) stack[depth - 1] = ctx;
    else stack[depth++] = ctx;
    return CUDA_SUCCESS;
}

int crane_c_cuCtxPushCurrent_4000(void *ctx) {
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    if (depth == STACK_MAX) return CUDA_ERROR_OUT_OF_MEMORY;
    stack[depth++] = ctx;
    return CUDA_SUCCESS;
}

int crane_c_cuCtxPopCurrent_4000(void **pctx) {
    if (!depth) return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = stack[--depth];
    if (pctx) *pctx = c;
    return CUDA_SUCCESS;
}

static int ctx_device(void *ctx, int *device) {
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    int d = crane_primary_dev(ctx);
    *device = d < 0 ? 0 : d;  /* a session serves one device: created contexts are on it */
    return CUDA_SUCCESS;
}

int crane_c_cuCtxGetDevice_2000(int *device) { return ctx_device(crane_ctx_current(), device); }

int crane_c_cuCtxGetDevice_13000(int *device, void *ctx) {
    return ctx_device(ctx ? ctx : crane_ctx_current(), device);
}

int crane_c_cuCtxGetApiVersion_3020(void *ctx, unsigned int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    if (!ctx && !crane_ctx_current()) return CUDA_ERROR_INVALID_CONTEXT;
    *version = 3020;
    return CUDA_SUCCESS;
}

int crane_c_cuCtxGetFlags_7000(unsigned int *flags) {
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = crane_ctx_current();
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    int d = crane_primary_dev(c);
    *flags = d < 0 ? 0 : primaries[d].flags;
    return CUDA_SUCCESS;
}

/* cuCtxGetId: an id unique for the process's life, never reused. A created context's handle is
 * a guest-chosen id that is never reused (crane/guest/handles.py; its kind byte keeps it apart
 * from the small numbers below), so it is its own id. A primary context gets a fresh number the
 * first time it is asked after each reset (the reset destroys the context behind the handle).
 * Local: cuBLASLt asks it (through an export table) on every GEMM. */
static unsigned long long primary_ids[CRANE_MAX_DEVICES];
static unsigned long long next_primary_id;

int crane_c_cuCtxGetId_12000(void *ctx, unsigned long long *id) {
    if (!id) return CUDA_ERROR_INVALID_VALUE;
    if (!ctx) ctx = crane_ctx_current();
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    int d = crane_primary_dev(ctx);
    if (d < 0) {
        *id = (unsigned long long)(uintptr_t)ctx;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&prim_lock);
    if (!primary_ids[d]) primary_ids[d] = ++next_primary_id;
    *id = primary_ids[d];
    pthread_mutex_unlock(&prim_lock);
    return CUDA_SUCCESS;
}

static int check_dev(int dev) {
    return dev >= 0 && dev < CRANE_MAX_DEVICES ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

int crane_c_cuDevicePrimaryCtxRetain_7000(void **pctx, int dev) {
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&prim_lock);
    primaries[dev].refs++;
    pthread_mutex_unlock(&prim_lock);
    *pctx = crane_primary_ctx(dev);
    return CUDA_SUCCESS;
}

/* Tear the primary context down: CLS destructors first (cudart frees its state there), then
 * the Python side replaces the remote context (all its memory, modules, streams go). */
static int primary_reset(int dev) {
    crane_cls_destroy_ctx(crane_primary_ctx(dev));
    pthread_mutex_lock(&prim_lock);
    primary_ids[dev] = 0;  /* the next context behind this handle is a new one */
    pthread_mutex_unlock(&prim_lock);
    int gate = crane_py_gate(1);  /* after the interpreter is gone: nothing remote to reset */
    return gate >= 0 ? gate : crane_py_primary_reset(dev);
}

int crane_c_cuDevicePrimaryCtxRelease_7000(int dev) {
    if (check_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&prim_lock);
    int last = primaries[dev].refs == 1;
    if (primaries[dev].refs > 0) primaries[dev].refs--;
    pthread_mutex_unlock(&prim_lock);
    return last ? primary_reset(dev) : CUDA_SUCCESS;
}

int crane_c_cuDevicePrimaryCtxRelease_11000(int dev) {
    return crane_c_cuDevicePrimaryCtxRelease_7000(dev);
}

int crane_c_cuDevicePrimaryCtxReset_7000(int dev) {
    if (check_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&prim_lock);
    primaries[dev].refs = 0;
    pthread_mutex_unlock(&prim_lock);
    return primary_reset(dev);
}

int crane_c_cuDevicePrimaryCtxReset_11000(int dev) { return crane_c_cuDevicePrimaryCtxReset_7000(dev); }

int crane_c_cuDevicePrimaryCtxGetState_7000(int dev, unsigned int *flags, int *active) {
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    if (check_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *flags = primaries[dev].flags;
    *active = primaries[dev].refs > 0;
    return CUDA_SUCCESS;
}

int crane_c_cuDevicePrimaryCtxSetFlags_7000(int dev, unsigned int flags) {
    if (check_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    primaries[dev].flags = flags;  /* scheduling hints only: nothing to forward */
    return CUDA_SUCCESS;
}

int crane_c_cuDevicePrimaryCtxSetFlags_11000(int dev, unsigned int flags) {
    return crane_c_cuDevicePrimaryCtxSetFlags_7000(dev, flags);
}

/* Keep host allocations out of the session's device VA window (guest-chosen device addresses
 * must never alias host memory, or cuMemcpy could not tell them apart). Returns 0 on success. */
#include <sys/mman.h>
#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
int crane_reserve_window(unsigned long long base, unsigned long long size) {
    void *p = mmap((void *)(uintptr_t)base, (size_t)size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == MAP_FAILED) return -1;
    if (p != (void *)(uintptr_t)base) {  /* an old kernel that treats the address as a hint */
        munmap(p, (size_t)size);
        return -1;
    }
    return 0;
}
