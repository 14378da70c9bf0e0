// Driver API: load a module from PTX text (JIT) or from a fatbin file, launch with
// kernelParams and with the `extra` buffer, read a module global, query pointer attributes.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda.h>
#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *n_; cuGetErrorName(r_, &n_); printf("FAIL %s: %s\n", #x, n_); return 1; } } while (0)
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb"); if (!f) return NULL;
    fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
    char *buf = (char *)calloc(n + 1, 1); fread(buf, 1, n, f); fclose(f);
    *len = n; return buf;
}
int main(int argc, char **argv) {
    if (argc < 3) return 2;
    CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction fn;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    char name[128]; CK(cuDeviceGetName(name, sizeof name, dev));
    int major; CK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    if (!strcmp(argv[1], "ptx")) {
        size_t len; char *ptx = slurp(argv[2], &len);
        CK(cuModuleLoadData(&mod, ptx));
    } else if (!strcmp(argv[1], "fatbin-data")) {
        size_t len; char *fb = slurp(argv[2], &len);
        CK(cuModuleLoadData(&mod, fb));
    } else {
        CK(cuModuleLoad(&mod, argv[2]));
    }
    CK(cuModuleGetFunction(&fn, mod, "scale"));
    const int n = 100;
    float h[n]; for (int i = 0; i < n; i++) h[i] = i;
    CUdeviceptr d; CK(cuMemAlloc(&d, n * sizeof(float)));
    CK(cuMemcpyHtoD(d, h, n * sizeof(float)));
    float a = 3.0f; int nn = n;
    void *params[] = {&d, &a, &nn};
    CK(cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 0, NULL, params, NULL));
    struct { CUdeviceptr p; float a; int n; } buf = {d, 0.5f, n};
    size_t size = sizeof buf;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                     CU_LAUNCH_PARAM_END};
    CK(cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 0, NULL, NULL, extra));
    CK(cuCtxSynchronize());
    CK(cuMemcpyDtoH(h, d, n * sizeof(float)));
    CUdeviceptr g; size_t gsize; int count = 0;
    CK(cuModuleGetGlobal(&g, &gsize, mod, "counter"));
    CK(cuMemcpyDtoH(&count, g, sizeof count));
    unsigned mtype = 0; CUdeviceptr start = 0;
    CK(cuPointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 8));
    CK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + 8));
    size_t off, psz; CK(cuFuncGetParamInfo(fn, 1, &off, &psz));
    printf("mode=%s h[1]=%.2f h[99]=%.2f counter=%d gsize=%zu\n", argv[1], h[1], h[99], count, gsize);
    printf("memtype=%u start_ok=%d param1=(%zu,%zu) cc_major_ok=%d\n", mtype, start == d,
           off, psz, major >= 7);
    CK(cuMemFree(d));
    CK(cuModuleUnload(mod));
    CK(cuCtxDestroy(ctx));
    printf("ok\n");
    return 0;
}
