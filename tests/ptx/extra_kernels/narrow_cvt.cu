// Narrow-format conversions through CUDA's own intrinsics (cuda_fp8.h, cuda_fp6.h, cuda_fp4.h).
// The same function runs as a kernel (compiled to PTX: the cvt instructions on compute_90 for
// FP8, on compute_100f for all formats) and on the host, where the headers use NVIDIA's
// software emulation: the host output is the reference the simulated kernel must match.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_fp4.h>
#include <cuda_fp6.h>
#include <cuda_fp8.h>

#define WORDS 20

__host__ __device__ static unsigned h2u(__half2_raw h) {
    return (unsigned)h.x | ((unsigned)h.y << 16);
}

__host__ __device__ static void convert_one(const float *in, unsigned *out, int i) {
    float a = in[2 * i], b = in[2 * i + 1];
    unsigned u;
    memcpy(&u, &a, 4);
    float2 ab = make_float2(a, b);
    unsigned *o = out + WORDS * i;
    o[0] = __nv_cvt_float2_to_fp8x2(ab, __NV_SATFINITE, __NV_E4M3);
    o[1] = __nv_cvt_float2_to_fp8x2(ab, __NV_SATFINITE, __NV_E5M2);
    o[2] = h2u(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u & 0xFFFF), __NV_E4M3));
    o[3] = h2u(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u & 0xFFFF), __NV_E5M2));
    o[4] = __nv_cvt_float2_to_fp6x2(ab, __NV_E2M3, cudaRoundNearest);
    o[5] = __nv_cvt_float2_to_fp6x2(ab, __NV_E3M2, cudaRoundNearest);
    o[6] = __nv_cvt_float2_to_fp4x2(ab, __NV_E2M1, cudaRoundNearest);
    o[7] = h2u(__nv_cvt_fp6x2_to_halfraw2((__nv_fp6x2_storage_t)(u & 0x3F3F), __NV_E2M3));
    o[8] = h2u(__nv_cvt_fp6x2_to_halfraw2((__nv_fp6x2_storage_t)(u & 0x3F3F), __NV_E3M2));
    o[9] = h2u(__nv_cvt_fp4x2_to_halfraw2((__nv_fp4x2_storage_t)(u & 0xFF), __NV_E2M1));
    o[10] = __nv_cvt_float2_to_e8m0x2(ab, __NV_SATFINITE, cudaRoundZero);
    o[11] = __nv_cvt_float2_to_e8m0x2(ab, __NV_NOSAT, cudaRoundZero);
    o[12] = __nv_cvt_float2_to_e8m0x2(ab, __NV_SATFINITE, cudaRoundPosInf);
    o[13] = __nv_cvt_float2_to_e8m0x2(ab, __NV_NOSAT, cudaRoundPosInf);
    __nv_bfloat162_raw e = __nv_cvt_e8m0x2_to_bf162raw((__nv_fp8x2_storage_t)(u & 0xFFFF));
    o[14] = (unsigned)e.x | ((unsigned)e.y << 16);
    __half2_raw hr;
    hr.x = (unsigned short)(u & 0xFFFF);
    hr.y = (unsigned short)(u >> 16);
    o[15] = __nv_cvt_halfraw2_to_fp8x2(hr, __NV_SATFINITE, __NV_E4M3);
    o[16] = __nv_cvt_halfraw2_to_fp8x2(hr, __NV_SATFINITE, __NV_E5M2);
    __nv_bfloat162_raw br;
    br.x = (unsigned short)(u & 0xFFFF);
    br.y = (unsigned short)(u >> 16);
    o[17] = __nv_cvt_bfloat162raw_to_e8m0x2(br, __NV_SATFINITE, cudaRoundZero);
    o[18] = __nv_cvt_bfloat162raw_to_e8m0x2(br, __NV_NOSAT, cudaRoundPosInf);
    o[19] = __nv_cvt_bfloat162raw_to_e8m0x2(br, __NV_SATFINITE, cudaRoundPosInf);
}

extern "C" __global__ void narrow(const float *in, unsigned *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) convert_one(in, out, i);
}

// host: narrow_cvt IN OUT -- IN holds 2n floats, OUT receives WORDS*n words
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 3;
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    int n = (int)(bytes / 8);
    float *in = (float *)malloc(bytes);
    unsigned *out = (unsigned *)calloc((size_t)WORDS * n, 4);
    if (fread(in, 1, bytes, f) != (size_t)bytes) return 4;
    fclose(f);
    for (int i = 0; i < n; i++) convert_one(in, out, i);
    f = fopen(argv[2], "wb");
    fwrite(out, 4, (size_t)WORDS * n, f);
    fclose(f);
    return 0;
}
