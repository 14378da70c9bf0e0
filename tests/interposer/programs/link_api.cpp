// cuLink* over PTX, object and library inputs, with the JIT logs read back through the
// option arrays; failing links (an undefined and a multiply-defined symbol) and a failing
// cuModuleLoadDataEx report their reasons in the error log buffer.
// Usage: link_api KERNEL.ptx LIB.ptx LIB.o LIB.a LIB.cubin
#include <cuda.h>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

static std::string slurp(const char *path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

struct Logs {
    char info[4096];
    char error[4096];
    CUjit_option opts[5] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                            CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                            CU_JIT_WALL_TIME};
    void *vals[5];
    Logs() { reset(); }
    void reset() {
        memset(info, 'x', sizeof info);
        memset(error, 'x', sizeof error);
        vals[0] = info;
        vals[1] = (void *)(uintptr_t)sizeof info;
        vals[2] = error;
        vals[3] = (void *)(uintptr_t)sizeof error;
        vals[4] = nullptr;
    }
    size_t info_used() const { return (size_t)(uintptr_t)vals[1]; }
    size_t error_used() const { return (size_t)(uintptr_t)vals[3]; }
    float wall() const {
        float f;
        memcpy(&f, &vals[4], sizeof f);
        return f;
    }
};

// Link the inputs (type, path) and return the result; on success run the kernel.
static CUresult link_and_run(const char *label, Logs &logs, int count, const CUjitInputType *types,
                             const char *const *paths, bool by_data) {
    CUlinkState st;
    CUresult r = cuLinkCreate(5, logs.opts, logs.vals, &st);
    if (r != CUDA_SUCCESS) return r;
    for (int i = 0; i < count && r == CUDA_SUCCESS; ++i) {
        if (by_data && types[i] == CU_JIT_INPUT_PTX) {
            std::string text = slurp(paths[i]);
            r = cuLinkAddData(st, types[i], (void *)text.c_str(), text.size() + 1, paths[i], 0,
                              nullptr, nullptr);
        } else {
            r = cuLinkAddFile(st, types[i], paths[i], 0, nullptr, nullptr);
        }
    }
    void *image = nullptr;
    size_t size = 0;
    if (r == CUDA_SUCCESS) r = cuLinkComplete(st, &image, &size);
    if (r == CUDA_SUCCESS) {
        CUmodule mod;
        CUfunction fn;
        r = cuModuleLoadData(&mod, image);
        if (r == CUDA_SUCCESS) r = cuModuleGetFunction(&fn, mod, "apply");
        if (r == CUDA_SUCCESS) {
            const int n = 40;
            CUdeviceptr d;
            cuMemAlloc(&d, n * sizeof(float));
            int nn = n;
            void *args[] = {&d, &nn};
            r = cuLaunchKernel(fn, 1, 1, 1, 64, 1, 1, 0, nullptr, args, nullptr);
            float h[n];
            if (r == CUDA_SUCCESS) r = cuMemcpyDtoH(h, d, sizeof h);
            printf("%s ok=%d out[39]=%.1f size_ok=%d info_nul=%d info_len_ok=%d wall_ok=%d\n",
                   label, r == CUDA_SUCCESS, h[39], size > 0,
                   logs.info[logs.info_used()] == '\0', strlen(logs.info) == logs.info_used(),
                   logs.wall() >= 0.0f);
            cuMemFree(d);
            cuModuleUnload(mod);
        }
    }
    cuLinkDestroy(st);
    return r;
}

int main(int argc, char **argv) {
    if (argc != 6) return 2;
    const char *kernel = argv[1], *lib_ptx = argv[2], *lib_obj = argv[3], *lib_a = argv[4];
    const char *lib_cubin = argv[5];
    cuInit(0);
    CUdevice dev;
    CUcontext ctx;
    cuDeviceGet(&dev, 0);
    cuCtxCreate(&ctx, nullptr, 0, dev);
    Logs logs;

    const CUjitInputType ptx2[] = {CU_JIT_INPUT_PTX, CU_JIT_INPUT_PTX};
    const char *p_ptx[] = {kernel, lib_ptx};
    CUresult r = link_and_run("ptx-data", logs, 2, ptx2, p_ptx, true);
    printf("ptx-data result=%d info=[%s]\n", (int)r, logs.info);

    logs.reset();
    r = link_and_run("ptx-file", logs, 2, ptx2, p_ptx, false);
    printf("ptx-file result=%d\n", (int)r);

    logs.reset();
    const CUjitInputType obj[] = {CU_JIT_INPUT_PTX, CU_JIT_INPUT_OBJECT};
    const char *p_obj[] = {kernel, lib_obj};
    r = link_and_run("object", logs, 2, obj, p_obj, false);
    printf("object result=%d\n", (int)r);

    logs.reset();
    const CUjitInputType lib[] = {CU_JIT_INPUT_PTX, CU_JIT_INPUT_LIBRARY};
    const char *p_lib[] = {kernel, lib_a};
    r = link_and_run("library", logs, 2, lib, p_lib, false);
    printf("library result=%d\n", (int)r);

    logs.reset();
    r = link_and_run("undefined", logs, 1, ptx2, p_ptx, true);
    printf("undefined result=%d error_nul=%d error_len_ok=%d error=[%s]\n", (int)r,
           logs.error[logs.error_used()] == '\0', strlen(logs.error) == logs.error_used(),
           logs.error);

    logs.reset();
    const CUjitInputType ptx3[] = {CU_JIT_INPUT_PTX, CU_JIT_INPUT_PTX, CU_JIT_INPUT_PTX};
    const char *p_dup[] = {kernel, lib_ptx, lib_ptx};
    r = link_and_run("duplicate", logs, 3, ptx3, p_dup, true);
    printf("duplicate result=%d error=[%s]\n", (int)r, logs.error);

    // SASS cannot be linked here: refused when added, the reason in the error log
    logs.reset();
    const CUjitInputType sass[] = {CU_JIT_INPUT_PTX, CU_JIT_INPUT_CUBIN};
    const char *p_sass[] = {kernel, lib_cubin};
    r = link_and_run("cubin", logs, 2, sass, p_sass, false);
    printf("cubin result=%d error=[%s]\n", (int)r, logs.error);

    // a module load whose JIT fails: the reason in the error log, capped at the buffer size
    logs.reset();
    logs.vals[3] = (void *)(uintptr_t)24;
    CUmodule bad;
    const char *broken = ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k() {\n"
                         "  frobnicate.u32 %r1;\n}\n";
    r = cuModuleLoadDataEx(&bad, broken, 5, logs.opts, logs.vals);
    printf("loadex result=%d used=%zu nul=%d error=[%s]\n", (int)r, logs.error_used(),
           logs.error[23] == '\0', logs.error);
    cuCtxDestroy(ctx);
    return 0;
}
