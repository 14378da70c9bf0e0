// atomicAdd on __half, __half2, __nv_bfloat16 and __nv_bfloat162 (atom.add.noftz.f16 and kin):
// scatter-adds into a few bins, so many lanes contend on each word.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" __global__ void add_h(const __half* v, const int* bin, __half* out, __half* old, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) old[i] = atomicAdd(&out[bin[i]], v[i]);
}

extern "C" __global__ void add_h2(const __half2* v, const int* bin, __half2* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&out[bin[i]], v[i]);
}

extern "C" __global__ void add_bh(const __nv_bfloat16* v, const int* bin, __nv_bfloat16* out,
                                  __nv_bfloat16* old, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) old[i] = atomicAdd(&out[bin[i]], v[i]);
}

extern "C" __global__ void add_bh2(const __nv_bfloat162* v, const int* bin, __nv_bfloat162* out,
                                   int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&out[bin[i]], v[i]);
}

// The same on shared memory: per-block bins, then written out.
extern "C" __global__ void add_h_shared(const __half* v, const int* bin, __half* out, int n) {
    __shared__ __half s[16];
    if (threadIdx.x < 16) s[threadIdx.x] = __float2half(0.0f);
    __syncthreads();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&s[bin[i] & 15], v[i]);
    __syncthreads();
    if (threadIdx.x < 16) out[blockIdx.x * 16 + threadIdx.x] = s[threadIdx.x];
}
