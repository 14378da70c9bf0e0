/* Page-locked host memory, as a remote GPU sees it: plain guest memory. cuMemHostAlloc and
 * cuMemHostRegister succeed and are recorded (so pointer-attribute queries and cuMemHostGetFlags
 * can answer); copies from such memory go through the session like any other host memory.
 * Memory a kernel must reach (the DEVICEMAP flag) is the Python side's (crane/guest/mirror.py):
 * its handlers call the plain paths here and record such blocks with crane_host_add. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "crane_cuda.h"
#include "../generated/impl.h"

struct host_block { char *p; size_t size; unsigned flags; int owned; struct host_block *next; };
static struct host_block *blocks;
static pthread_mutex_t host_lock = PTHREAD_MUTEX_INITIALIZER;

/* owned: 1 = allocated here (freed here), 0 = registered, 2 = placed by the Python side */
static int add(void *p, size_t size, unsigned flags, int owned) {
    struct host_block *b = malloc(sizeof *b);
    if (!b) return CUDA_ERROR_OUT_OF_MEMORY;
    *b = (struct host_block){p, size, flags, owned, NULL};
    pthread_mutex_lock(&host_lock);
    b->next = blocks;
    blocks = b;
    pthread_mutex_unlock(&host_lock);
    return CUDA_SUCCESS;
}

/* 1 and the block's base, size and flags when p lies inside a recorded block, else 0. */
int crane_host_lookup(const void *p, void **base, size_t *size, unsigned *flags) {
    int found = 0;
    pthread_mutex_lock(&host_lock);
    for (struct host_block *b = blocks; b; b = b->next)
        if ((const char *)p >= b->p && (const char *)p < b->p + (b->size ? b->size : 1)) {
            if (base) *base = b->p;
            if (size) *size = b->size;
            if (flags) *flags = b->flags;
            found = 1;
            break;
        }
    pthread_mutex_unlock(&host_lock);
    return found;
}

static struct host_block *take(void *p, int owned) {
    pthread_mutex_lock(&host_lock);
    for (struct host_block **pb = &blocks; *pb; pb = &(*pb)->next)
        if ((*pb)->p == p && (*pb)->owned == owned) {
            struct host_block *b = *pb;
            *pb = b->next;
            pthread_mutex_unlock(&host_lock);
            return b;
        }
    pthread_mutex_unlock(&host_lock);
    return NULL;
}

int crane_host_add(void *p, size_t size, unsigned flags) { return add(p, size, flags, 2); }

/* Forget a block crane_host_add recorded; 0 if there was one. */
int crane_host_remove(void *p) {
    struct host_block *b = take(p, 2);
    if (!b) return -1;
    free(b);
    return 0;
}

int crane_c_cuMemHostAlloc_2020(void **pp, size_t bytesize, unsigned int Flags) {
    if (!pp || !bytesize) return CUDA_ERROR_INVALID_VALUE;
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytesize)) return CUDA_ERROR_OUT_OF_MEMORY;
    memset(p, 0, bytesize);
    if (add(p, bytesize, Flags, 1)) { free(p); return CUDA_ERROR_OUT_OF_MEMORY; }
    *pp = p;
    return CUDA_SUCCESS;
}

int crane_c_cuMemAllocHost_3020(void **pp, size_t bytesize) {
    return crane_c_cuMemHostAlloc_2020(pp, bytesize, 0);
}

int crane_c_cuMemFreeHost_2000(void *p) {
    struct host_block *b = take(p, 1);
    if (!b) return CUDA_ERROR_INVALID_VALUE;
    free(b->p);
    free(b);
    return CUDA_SUCCESS;
}

int crane_c_cuMemHostRegister_6050(void *p, size_t bytesize, unsigned int Flags) {
    if (!p || !bytesize) return CUDA_ERROR_INVALID_VALUE;
    if (crane_host_lookup(p, NULL, NULL, NULL)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    return add(p, bytesize, Flags, 0);
}

int crane_c_cuMemHostUnregister_4000(void *p) {
    struct host_block *b = take(p, 0);
    if (!b) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    free(b);
    return CUDA_SUCCESS;
}

int crane_c_cuMemHostGetFlags_2030(unsigned int *pFlags, void *p) {
    if (!pFlags) return CUDA_ERROR_INVALID_VALUE;
    unsigned f;
    if (!crane_host_lookup(p, NULL, NULL, &f)) return CUDA_ERROR_INVALID_VALUE;
    *pFlags = f;
    return CUDA_SUCCESS;
}

/* The CUDA 12.2 forms take a CUmemLocation by value, which the Python side cannot receive:
 * translate the location to the device ordinal the older forms take (CU_DEVICE_CPU for host
 * locations) and call them. */
enum { CRANE_LOC_DEVICE = 1, CRANE_LOC_HOST = 2, CRANE_LOC_HOST_NUMA = 3,
       CRANE_LOC_HOST_NUMA_CURRENT = 4 };
#define CRANE_DEVICE_CPU (-1)

static int location_device(CUmemLocation_v1 loc, int *dev) {
    switch (loc.type) {
    case CRANE_LOC_DEVICE: *dev = loc.id; return 0;
    case CRANE_LOC_HOST: case CRANE_LOC_HOST_NUMA: case CRANE_LOC_HOST_NUMA_CURRENT:
        *dev = CRANE_DEVICE_CPU; return 0;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult cuMemPrefetchAsync(unsigned long long, size_t, int, void *);
CUresult cuMemAdvise(unsigned long long, size_t, int, int);

int crane_c_cuMemPrefetchAsync_12020(unsigned long long p, size_t n, CUmemLocation_v1 loc,
                                      unsigned int flags, void *stream) {
    int dev;
    if (flags || location_device(loc, &dev)) return CUDA_ERROR_INVALID_VALUE;
    return cuMemPrefetchAsync(p, n, dev, stream);
}

int crane_c_cuMemAdvise_12020(unsigned long long p, size_t n, int advice,
                               CUmemLocation_v1 loc) {
    int dev;
    if (location_device(loc, &dev)) return CUDA_ERROR_INVALID_VALUE;
    return cuMemAdvise(p, n, advice, dev);
}
