/* Logging for the C side: CRANE_TRACE=1 traces every driver call; unsupported calls log once. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include "crane_cuda.h"

int crane_trace_on;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor)) static void crane_log_init(void) {
    const char *t = getenv("CRANE_TRACE");
    crane_trace_on = t && *t && strcmp(t, "0") != 0;
}

void crane_log(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&log_lock);
    fputs("crane: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    fflush(stderr);
    pthread_mutex_unlock(&log_lock);
    va_end(ap);
}

void crane_trace(const char *name, CUresult r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&log_lock);
    fprintf(stderr, "crane-trace: %s(", name);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, ") = %d\n", r);
    fflush(stderr);
    pthread_mutex_unlock(&log_lock);
    va_end(ap);
}

/* A small open-addressing set of names already reported (pointers into .rodata). */
static const char *reported[1024];

CUresult crane_unsupported(const char *name) {
    unsigned h = 0;
    for (const char *p = name; *p; p++) h = h * 31 + (unsigned char)*p;
    int first = 1;
    pthread_mutex_lock(&log_lock);
    for (unsigned i = 0; i < 1024; i++) {
        unsigned k = (h + i) & 1023;
        if (reported[k] == name) { first = 0; break; }
        if (!reported[k]) { reported[k] = name; break; }
    }
    pthread_mutex_unlock(&log_lock);
    if (first)
        crane_log("%s is not supported by Crane: returning CUDA_ERROR_NOT_SUPPORTED", name);
    if (crane_trace_on) crane_trace(name, CUDA_ERROR_NOT_SUPPORTED, "...");
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* Path of this library, so the embedded interpreter can find the package it was installed
 * with (the library lives at <root>/crane/interposer/_lib/libcuda.so.1). */
#include <dlfcn.h>
const char *crane_self_path(void) {
    Dl_info info;
    if (dladdr((void *)crane_self_path, &info) && info.dli_fname) return info.dli_fname;
    return "";
}
