/* Registers exit-time teardown as cudart and cuBLASLt do: a C atexit handler that releases the
 * primary context and unloads a library, which runs after the Python interpreter finalized. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*release_t)(int);
typedef int (*unload_t)(void *);
typedef int (*sync_t)(void);
static void *cuda, *library;

static void teardown(void) {
    int r1 = ((release_t)dlsym(cuda, "cuDevicePrimaryCtxRelease_v2"))(0);
    int r2 = ((unload_t)dlsym(cuda, "cuLibraryUnload"))(library);
    int r3 = ((sync_t)dlsym(cuda, "cuCtxSynchronize"))();
    printf("teardown release=%d unload=%d synchronize=%d\n", r1, r2, r3);
    fflush(stdout);
}

void crane_test_register(void *lib_handle, void *lib) {
    cuda = lib_handle;
    library = lib;
    atexit(teardown);
}
