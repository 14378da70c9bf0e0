/* Context-local storage (cudart's CONTEXT_LOCAL_STORAGE table): put/get/delete per (context,
 * key), local and lock-protected because cudart calls get before every runtime API call.
 * Destroying or resetting a context runs each entry's destructor. */
#include <pthread.h>
#include <stdlib.h>

#include "crane_cuda.h"

typedef void (*cls_dtor)(CUcontext, void *, void *);
struct cls_entry {
    CUcontext ctx;
    void *key;
    void *value;
    cls_dtor dtor;
    struct cls_entry *next;
};
static struct cls_entry *entries;
static pthread_mutex_t cls_lock = PTHREAD_MUTEX_INITIALIZER;

static CUcontext resolve(CUcontext ctx) { return ctx ? ctx : crane_ctx_current(); }

CUresult crane_cls_put(CUcontext ctx, void *key, void *value, cls_dtor dtor) {
    ctx = resolve(ctx);
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&cls_lock);
    struct cls_entry *e;
    for (e = entries; e; e = e->next)
        if (e->ctx == ctx && e->key == key) break;
    if (!e) {
        e = calloc(1, sizeof *e);
        if (!e) { pthread_mutex_unlock(&cls_lock); return CUDA_ERROR_OUT_OF_MEMORY; }
        e->ctx = ctx;
        e->key = key;
        e->next = entries;
        entries = e;
    }
    e->value = value;
    e->dtor = dtor;
    pthread_mutex_unlock(&cls_lock);
    return CUDA_SUCCESS;
}

CUresult crane_cls_delete(CUcontext ctx, void *key) {
    ctx = resolve(ctx);
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&cls_lock);
    for (struct cls_entry **pe = &entries; *pe; pe = &(*pe)->next)
        if ((*pe)->ctx == ctx && (*pe)->key == key) {
            struct cls_entry *e = *pe;
            *pe = e->next;
            free(e);
            pthread_mutex_unlock(&cls_lock);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&cls_lock);
    return CUDA_ERROR_NOT_FOUND;
}

CUresult crane_cls_get(void **value, CUcontext ctx, void *key) {
    ctx = resolve(ctx);
    if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&cls_lock);
    for (struct cls_entry *e = entries; e; e = e->next)
        if (e->ctx == ctx && e->key == key) {
            *value = e->value;
            pthread_mutex_unlock(&cls_lock);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&cls_lock);
    return CUDA_ERROR_NOT_FOUND;
}

/* Run and drop every entry of ctx; destructors run without the lock (they may call back). */
void crane_cls_destroy_ctx(CUcontext ctx) {
    for (;;) {
        pthread_mutex_lock(&cls_lock);
        struct cls_entry **pe = &entries;
        while (*pe && (*pe)->ctx != ctx) pe = &(*pe)->next;
        struct cls_entry *e = *pe;
        if (e) *pe = e->next;
        pthread_mutex_unlock(&cls_lock);
        if (!e) return;
        if (e->dtor) e->dtor(ctx, e->key, e->value);
        free(e);
    }
}
