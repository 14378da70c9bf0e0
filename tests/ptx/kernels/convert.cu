#include <cuda_fp16.h>
#include <cuda_bf16.h>
// Conversions with explicit rounding, half and bfloat16.
extern "C" __global__ void conv_f32(const float* in, int* oi, unsigned* ou, long long* ol,
                                    float* of, double* od, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = in[i];
    oi[4 * i + 0] = __float2int_rn(x);
    oi[4 * i + 1] = __float2int_rz(x);
    oi[4 * i + 2] = __float2int_ru(x);
    oi[4 * i + 3] = __float2int_rd(x);
    ou[2 * i + 0] = __float2uint_rn(x);
    ou[2 * i + 1] = (unsigned)x;
    ol[2 * i + 0] = __float2ll_rz(x);
    ol[2 * i + 1] = (long long)(x * 1e10f);
    of[6 * i + 0] = rintf(x);
    of[6 * i + 1] = truncf(x);
    of[6 * i + 2] = floorf(x);
    of[6 * i + 3] = ceilf(x);
    of[6 * i + 4] = __int2float_rz(oi[4 * i + 0] * 77777);
    of[6 * i + 5] = __saturatef(x);
    od[i] = (double)x * 3.0;
}

extern "C" __global__ void conv_f64(const double* in, float* of, long long* ol, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double x = in[i];
    of[4 * i + 0] = (float)x;
    of[4 * i + 1] = __double2float_rz(x);
    of[4 * i + 2] = __double2float_ru(x);
    of[4 * i + 3] = __double2float_rd(x);
    ol[2 * i + 0] = __double2ll_rn(x);
    ol[2 * i + 1] = (long long)x;
}

extern "C" __global__ void conv_int(const long long* in, float* of, double* od, int* oi,
                                    short* os, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long x = in[i];
    of[2 * i + 0] = (float)x;
    of[2 * i + 1] = (float)(unsigned long long)x;
    od[i] = (double)x;
    oi[2 * i + 0] = (int)x;
    oi[2 * i + 1] = (signed char)x;
    os[i] = (short)(x >> 3);
}

extern "C" __global__ void conv_half(const float* in, __half* h, float* back, __nv_bfloat16* bf,
                                     float* bback, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = in[i];
    __half hx = __float2half_rn(x);
    h[i] = hx;
    __half s = __hadd(hx, __float2half(1.5f));
    __half p = __hmul(s, hx);
    __half f = __hfma(p, hx, s);
    back[3 * i + 0] = __half2float(hx);
    back[3 * i + 1] = __half2float(p);
    back[3 * i + 2] = __half2float(f);
    __nv_bfloat16 b = __float2bfloat16(x);
    bf[i] = b;
    bback[i] = __bfloat162float(b) * 2.0f;
}

extern "C" __global__ void half2_ops(const __half2* a, const __half2* b, __half2* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __half2 x = a[i], y = b[i];
    out[3 * i + 0] = __hadd2(x, y);
    out[3 * i + 1] = __hmul2(x, y);
    out[3 * i + 2] = __hfma2(x, y, x);
}
