/* Shared declarations for the interposer's hand-written C (no CUDA headers needed: the types
 * are lowered the same way crane/codegen/gen_driver_protos.py lowers them). */
#ifndef CRANE_CUDA_H
#define CRANE_CUDA_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef void *CUcontext;
typedef int CUdevice;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_UNKNOWN 999

/* Structs some entry points take by value (their C handlers are hand-written). */
typedef struct { int type; int id; } CUmemLocation_v1;

#define CRANE_STREAM_PER_THREAD ((void *)0x2)
#define CRANE_MAX_DEVICES 1

typedef struct {
    const char *name;
    int version;
    int per_thread;  /* a _ptds/_ptsz variant */
    void *fn;
} crane_proc_t;

extern const crane_proc_t crane_procs[];
extern const unsigned crane_nprocs;

/* log.c */
extern int crane_trace_on;
void crane_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void crane_trace(const char *name, CUresult r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
CUresult crane_unsupported(const char *name);

/* context.c: thread-local current context, per-thread-stream marker, primary contexts */
CUcontext crane_ctx_current(void);
void crane_ptds_enter(void);
void crane_ptds_leave(void);
int crane_in_ptds(void);
CUcontext crane_primary_ctx(int dev);
int crane_primary_dev(CUcontext ctx);  /* device ordinal, or -1 if not a primary context */
void crane_ctx_forget(CUcontext ctx);
int crane_reserve_window(unsigned long long base, unsigned long long size);

/* hostmem.c */
/* python-callable begin: interposer/build_interposer.py declares these to cffi as written */
void crane_py_mark_started(void);
int crane_host_lookup(const void *p, void **base, size_t *size, unsigned *flags);
int crane_host_add(void *p, size_t size, unsigned flags);
int crane_host_remove(void *p);
int crane_c_cuMemHostAlloc_2020(void **pp, size_t bytesize, unsigned int Flags);
int crane_c_cuMemFreeHost_2000(void *p);
int crane_c_cuMemHostRegister_6050(void *p, size_t bytesize, unsigned int Flags);
int crane_c_cuMemHostUnregister_4000(void *p);
/* python-callable end */
const char *crane_self_path(void);

/* pygate.c: run before every call into Python (see there). Returns -1 to go ahead, or the
 * CUresult to answer without Python. */
extern int crane_py_prepared;
int crane_py_alive(void);
int crane_py_gate_slow(int teardown);
static inline int crane_py_gate(int teardown) {
    if (__builtin_expect(crane_py_prepared, 1) && __builtin_expect(crane_py_alive(), 1))
        return -1;
    return crane_py_gate_slow(teardown);
}

/* cls.c: context-local storage */
void crane_cls_destroy_ctx(CUcontext ctx);


#endif
