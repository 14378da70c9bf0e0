// Tensor-core kernels through the WMMA C++ API (mma.h): one warp per block computes one
// 16x16 (or 32x8 / 8x32) tile D = A B + C, with A, B, C loaded row- or column-major from
// global memory or through shared memory, and D stored in either layout. bf16 and tf32 need
// sm_80; the kernels are empty below it (the tests skip those architectures).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
using namespace nvcuda;

// half -> float, 16x16x16, A row-major, B column-major, C row-major; one tile per block
// (blockIdx.x selects the tile's matrices); D = alpha * (A B + C) element-wise on the fragment
extern "C" __global__ void wmma_f16(const half* a, const half* b, const float* c, float* d,
                                    float alpha) {
    int t = blockIdx.x;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::load_matrix_sync(fa, a + t * 256, 16);
    wmma::load_matrix_sync(fb, b + t * 256, 16);
    wmma::load_matrix_sync(fc, c + t * 256, 16, wmma::mem_row_major);
    wmma::mma_sync(fc, fa, fb, fc);
    for (int i = 0; i < fc.num_elements; i++) fc.x[i] *= alpha;
    wmma::store_matrix_sync(d + t * 256, fc, 16, wmma::mem_row_major);
}

// half -> half accumulators through shared memory, 32x8x16: A column-major, B row-major with a
// leading dimension larger than the tile; D stored column-major
extern "C" __global__ void wmma_f16_shared(const half* a, const half* b, const half* c,
                                           half* d) {
    __shared__ __align__(32) half sa[16 * 32];
    __shared__ __align__(32) half sb[16 * 16];
    for (int i = threadIdx.x; i < 16 * 32; i += 32) sa[i] = a[i];
    for (int i = threadIdx.x; i < 16 * 16; i += 32) sb[i] = b[i];
    __syncwarp();
    wmma::fragment<wmma::matrix_a, 32, 8, 16, half, wmma::col_major> fa;
    wmma::fragment<wmma::matrix_b, 32, 8, 16, half, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 32, 8, 16, half> fc;
    wmma::load_matrix_sync(fa, sa, 32);
    wmma::load_matrix_sync(fb, sb, 16);
    wmma::load_matrix_sync(fc, c, 8, wmma::mem_row_major);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(d, fc, 32, wmma::mem_col_major);
}

// int8 -> int32, 8x32x16 (signed) and 16x16x16 (unsigned)
extern "C" __global__ void wmma_s8(const signed char* a, const signed char* b, const int* c,
                                   int* d, const unsigned char* ua, const unsigned char* ub,
                                   int* ud) {
#if __CUDA_ARCH__ >= 720
    wmma::fragment<wmma::matrix_a, 8, 32, 16, signed char, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 8, 32, 16, signed char, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 8, 32, 16, int> fc;
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 32);
    wmma::load_matrix_sync(fc, c, 32, wmma::mem_row_major);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(d, fc, 32, wmma::mem_row_major);
    wmma::fragment<wmma::matrix_a, 16, 16, 16, unsigned char, wmma::col_major> ga;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, unsigned char, wmma::col_major> gb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, int> gc;
    wmma::fill_fragment(gc, 7);
    wmma::load_matrix_sync(ga, ua, 16);
    wmma::load_matrix_sync(gb, ub, 16);
    wmma::mma_sync(gc, ga, gb, gc);
    wmma::store_matrix_sync(ud, gc, 16, wmma::mem_row_major);
#endif
}

// bf16 -> float 16x16x16 and tf32 -> float 16x16x8 (sm_80)
extern "C" __global__ void wmma_bf16_tf32(const __nv_bfloat16* a, const __nv_bfloat16* b,
                                          float* d, const float* ta, const float* tb,
                                          float* td) {
#if __CUDA_ARCH__ >= 800
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(d, fc, 16, wmma::mem_row_major);
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> ta_;
    wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> tb_;
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> tc;
    wmma::fill_fragment(tc, 0.0f);
    wmma::load_matrix_sync(ta_, ta, 8);
    wmma::load_matrix_sync(tb_, tb, 8);
    for (int i = 0; i < ta_.num_elements; i++) ta_.x[i] = wmma::__float_to_tf32(ta_.x[i]);
    for (int i = 0; i < tb_.num_elements; i++) tb_.x[i] = wmma::__float_to_tf32(tb_.x[i]);
    wmma::mma_sync(tc, ta_, tb_, tc);
    wmma::store_matrix_sync(td, tc, 16, wmma::mem_col_major);
#endif
}

// double 8x8x4 (sm_80)
extern "C" __global__ void wmma_f64(const double* a, const double* b, const double* c,
                                    double* d) {
#if __CUDA_ARCH__ >= 800
    wmma::fragment<wmma::matrix_a, 8, 8, 4, double, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 8, 8, 4, double, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 8, 8, 4, double> fc;
    wmma::load_matrix_sync(fa, a, 4);
    wmma::load_matrix_sync(fb, b, 4);
    wmma::load_matrix_sync(fc, c, 8, wmma::mem_row_major);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(d, fc, 8, wmma::mem_row_major);
#endif
}
