// cp.async (global -> shared, made at once in the compiled form): the pipeline primitives' 4-,
// 8- and 16-byte copies with a per-lane zero fill (register src-size), an ignore-src
// predicate, an immediate src-size, and copies whose source is out of bounds.
#include <cuda_pipeline_primitives.h>

// Lane i copies 16 bytes of in[i] with the last zf(i) bytes zero-filled (zf: 0, 4, 8, 12, 16),
// then reads its neighbour's copy after the barrier.
extern "C" __global__ void fill16(const float4* in, float4* out, int n, int shift) {
    __shared__ float4 s[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    size_t zf = ((i + shift) % 5) * 4;
    s[threadIdx.x] = make_float4(-1.0f, -2.0f, -3.0f, -4.0f);  // what the zero fill replaces
    if (i < n) __pipeline_memcpy_async(&s[threadIdx.x], &in[i], 16, zf);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    if (i < n) out[i] = s[(threadIdx.x + 1) % blockDim.x];
}

// The register src-size form: lane i reads (i + shift) % 17 bytes (16 or more: all of them).
extern "C" __global__ void fill_reg(const int4* in, int4* out, int n, int shift) {
    __shared__ int4 s[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned ds = (unsigned)__cvta_generic_to_shared(&s[threadIdx.x]);
    unsigned want = (unsigned)((i + shift) % 17);
    s[threadIdx.x] = make_int4(-1, -2, -3, -4);  // what the zero fill replaces
    if (i < n) asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(ds), "l"(in + i), "r"(want));
    asm volatile("cp.async.wait_all;");
    __syncthreads();
    if (i < n) out[i] = s[(threadIdx.x + 5) % blockDim.x];
}

// 8- and 4-byte copies, whole (an immediate size), from an offset the kernel is given.
extern "C" __global__ void small(const float2* in2, const float* in1, float* out, int n, int off) {
    __shared__ float2 a[256];
    __shared__ float b[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        __pipeline_memcpy_async(&a[threadIdx.x], &in2[i + off], 8);
        __pipeline_memcpy_async(&b[threadIdx.x], &in1[i + off], 4);
    }
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    if (i < n) out[i] = a[threadIdx.x].x * 2.0f + a[threadIdx.x].y + b[blockDim.x - 1 - threadIdx.x];
}

// The ignore-src predicate form (true: read nothing, the destination zero), and an immediate
// src-size of 8 (the source checked whole, half of it copied).
extern "C" __global__ void pred_imm(const int4* in, int4* out, int n) {
    __shared__ int4 s[256];
    __shared__ int4 t[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned ds = (unsigned)__cvta_generic_to_shared(&s[threadIdx.x]);
    unsigned dt = (unsigned)__cvta_generic_to_shared(&t[threadIdx.x]);
    int skip = (i & 3) == 1 || i >= n;
    s[threadIdx.x] = t[threadIdx.x] = make_int4(-1, -2, -3, -4);  // what the zero fill replaces
    const int4* src = in + (i < n ? i : 0);
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %2, 0;\n"
        "  cp.async.cg.shared.global [%0], [%1], 16, p; }" ::"r"(ds), "l"(src), "r"(skip));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, 8;" ::"r"(dt), "l"(src));
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group 0;");
    __syncthreads();
    if (i < n) {
        int4 a = s[threadIdx.x], c = t[(threadIdx.x + 3) % blockDim.x];
        out[i] = make_int4(a.x + c.x, a.y + c.y, a.z + c.z, a.w + c.w);
    }
}
