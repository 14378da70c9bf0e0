/* cuGetProcAddress: resolve (base name, requested ABI version, flags) against the generated
 * table: the newest variant introduced at or before the requested version, its _ptds/_ptsz
 * twin when the caller asks for per-thread default-stream semantics. Purely local. */
#include <string.h>

#include "crane_cuda.h"
#include "../generated/impl.h"

#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 0x2
enum { FOUND = 0, SYMBOL_NOT_FOUND = 1, VERSION_NOT_SUFFICIENT = 2 };

static unsigned first_row(const char *symbol) {
    unsigned lo = 0, hi = crane_nprocs;
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        if (strcmp(crane_procs[mid].name, symbol) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static int lookup(const char *symbol, void **pfn, int version, unsigned long long flags) {
    if (!symbol || !*symbol) return SYMBOL_NOT_FOUND;
    unsigned i = first_row(symbol);
    const crane_proc_t *normal = NULL, *pt = NULL;
    int any = 0;
    for (; i < crane_nprocs && strcmp(crane_procs[i].name, symbol) == 0; i++) {
        const crane_proc_t *p = &crane_procs[i];
        any = 1;
        if (p->version > version) continue;
        if (p->per_thread) pt = p;
        else normal = p;
    }
    if (!any) return SYMBOL_NOT_FOUND;
    if (!normal) return VERSION_NOT_SUFFICIENT;
    if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && pt && pt->version >= normal->version)
        *pfn = pt->fn;
    else
        *pfn = normal->fn;
    return FOUND;
}

int crane_c_cuGetProcAddress_12000(const char *symbol, void **pfn, int driverVersion,
                                   unsigned long long flags, int *symbolFound) {
    if (!pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    int st = lookup(symbol, pfn, driverVersion, flags);
    if (symbolFound) *symbolFound = st;
    return st == FOUND ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

int crane_c_cuGetProcAddress_11030(const char *symbol, void **pfn, int driverVersion,
                                   unsigned long long flags) {
    return crane_c_cuGetProcAddress_12000(symbol, pfn, driverVersion, flags, NULL);
}
