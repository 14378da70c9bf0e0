// bfloat16 (and half comparisons) as nvcc emits them for each architecture: arithmetic,
// pairs, conversions in every form the intrinsics use, comparisons, integers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
extern "C" __global__ void bf_ops(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* out, float* f, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    __nv_bfloat16 x = a[i], y = b[i];
    __nv_bfloat16 s = __hadd(x, y);
    __nv_bfloat16 p = __hmul(x, y);
    __nv_bfloat16 q = __hfma(x, y, s);
    __nv_bfloat16 m = __hmax(x, y);
    __nv_bfloat16 d = __hsub(m, __hneg(p));
    out[i] = __hadd(q, d);
    f[i] = __bfloat162float(x) * 2.0f + __bfloat162float(__float2bfloat16(f[i]));
  }
}
extern "C" __global__ void bf2_ops(const __nv_bfloat162* a, const __nv_bfloat162* b, __nv_bfloat162* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    __nv_bfloat162 x = a[i], y = b[i];
    out[i] = __hfma2(x, y, __hadd2(x, __habs2(y)));
  }
}
extern "C" __global__ void bf_convert(const float* in, __nv_bfloat16* out, float* back, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    __nv_bfloat16 h = __float2bfloat16(in[i]);
    out[i] = h;
    back[i] = __bfloat162float(h) + __bfloat162float(__float2bfloat16_rz(in[i]));
  }
}
extern "C" __global__ void bf_cmp(const __nv_bfloat16* a, const __nv_bfloat16* b, int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __hgt(a[i], b[i]) + 2 * __hle(a[i], b[i]) + 4 * __hisnan(a[i]);
}
extern "C" __global__ void h_cmp(const __half* a, const __half* b, int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __hgt(a[i], b[i]) + 2 * __hle(a[i], b[i]);
}
extern "C" __global__ void bf_int(const int* a, __nv_bfloat16* o, int* back, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { o[i] = __int2bfloat16_rn(a[i]); back[i] = __bfloat162int_rz(o[i]); }
}
extern "C" __global__ void h_int(const int* a, __half* o, int* back, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float f = a[i] * 1e-5f;
    o[i] = __hadd(__int2half_rn(a[i] >> 16), __hadd(__float2half_rd(f), __float2half_ru(f)));
    __half2 p = __floats2half2_rn(f, -f);
    back[i] = __half2int_rz(o[i]) + __half2int_rn(__low2half(p)) + __half_as_ushort(__high2half(p));
  }
}
