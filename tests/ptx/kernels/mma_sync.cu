// Warp-level mma.sync and ldmatrix/stmatrix/movmatrix in inline PTX, as CUTLASS and
// flash-attention kernels issue them. One warp per block. Fragments are either loaded with
// ldmatrix from shared memory or by each lane from global memory at the positions the PTX ISA
// documents (groupID = lane >> 2, threadID_in_group = lane % 4). Empty below sm_80 (sm_90 for
// stmatrix).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ unsigned smem(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

// m16n8k16 f16: A (16x16 row-major) by ldmatrix.x4; B by ldmatrix.x2.trans from a row-major
// [k][n] copy and by ldmatrix.x2 from a [n][k] copy; f32 accumulators (C from global) and an
// f16 accumulator (C = 0). D1, D2: f32 16x8; D3: f16 16x8.
extern "C" __global__ void mma_f16_ldmatrix(const half* a, const half* b_kn, const float* c,
                                            float* d1, float* d2, half* d3) {
#if __CUDA_ARCH__ >= 800
    __shared__ __align__(16) half sa[16 * 16];
    __shared__ __align__(16) half sb[16 * 8];
    __shared__ __align__(16) half sbt[8 * 16];
    int lane = threadIdx.x;
    for (int i = lane; i < 256; i += 32) sa[i] = a[i];
    for (int i = lane; i < 128; i += 32) {
        sb[i] = b_kn[i];
        sbt[(i % 8) * 16 + i / 8] = b_kn[i];
    }
    __syncwarp();
    unsigned a0, a1, a2, a3, b0, b1, t0, t1;
    int mi = lane / 8, j = lane % 8;
    const half* arow = sa + (j + 8 * (mi & 1)) * 16 + 8 * (mi >> 1);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(smem(arow)));
    const half* brow = sb + (lane % 16) * 8;  // row k of B, lanes 0-15
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared::cta.b16 {%0, %1}, [%2];"
                 : "=r"(b0), "=r"(b1) : "r"(smem(brow)));
    const half* btrow = sbt + (lane % 8) * 16 + 8 * ((lane / 8) & 1);  // row n of B^T
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                 : "=r"(t0), "=r"(t1) : "r"(smem(btrow)));
    int g = lane >> 2, t = lane & 3;
    float c0 = c[g * 8 + 2 * t], c1 = c[g * 8 + 2 * t + 1];
    float c2 = c[(g + 8) * 8 + 2 * t], c3 = c[(g + 8) * 8 + 2 * t + 1];
    float e0, e1, e2, e3, f0, f1, f2, f3;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %11, %12, %13};"
        : "=f"(e0), "=f"(e1), "=f"(e2), "=f"(e3)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2),
          "f"(c3));
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %11, %12, %13};"
        : "=f"(f0), "=f"(f1), "=f"(f2), "=f"(f3)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(t0), "r"(t1), "f"(c0), "f"(c1), "f"(c2),
          "f"(c3));
    d1[g * 8 + 2 * t] = e0; d1[g * 8 + 2 * t + 1] = e1;
    d1[(g + 8) * 8 + 2 * t] = e2; d1[(g + 8) * 8 + 2 * t + 1] = e3;
    d2[g * 8 + 2 * t] = f0; d2[g * 8 + 2 * t + 1] = f1;
    d2[(g + 8) * 8 + 2 * t] = f2; d2[(g + 8) * 8 + 2 * t + 1] = f3;
    unsigned h0, h1, z = 0;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0, %1}, {%2, %3, %4, %5}, "
        "{%6, %7}, {%8, %8};"
        : "=r"(h0), "=r"(h1) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(z));
    *(unsigned*)&d3[g * 8 + 2 * t] = h0;
    *(unsigned*)&d3[(g + 8) * 8 + 2 * t] = h1;
#endif
}

// m16n8k16 bf16 -> f32, fragments loaded by each lane from global: A 16x16, B [k][n] 16x8,
// C = 0.
extern "C" __global__ void mma_bf16(const __nv_bfloat16* a, const __nv_bfloat16* b, float* d) {
#if __CUDA_ARCH__ >= 800
    int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    const unsigned short* ua = (const unsigned short*)a;
    const unsigned short* ub = (const unsigned short*)b;
    unsigned ar[4], br[2];
    for (int r = 0; r < 4; r++) {
        int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
        ar[r] = ua[row * 16 + col] | ((unsigned)ua[row * 16 + col + 1] << 16);
    }
    for (int r = 0; r < 2; r++) {
        int k = 2 * t + 8 * r;
        br[r] = ub[k * 8 + g] | ((unsigned)ub[(k + 1) * 8 + g] << 16);
    }
    float z = 0.f, e0, e1, e2, e3;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
        : "=f"(e0), "=f"(e1), "=f"(e2), "=f"(e3)
        : "r"(ar[0]), "r"(ar[1]), "r"(ar[2]), "r"(ar[3]), "r"(br[0]), "r"(br[1]), "f"(z));
    d[g * 8 + 2 * t] = e0; d[g * 8 + 2 * t + 1] = e1;
    d[(g + 8) * 8 + 2 * t] = e2; d[(g + 8) * 8 + 2 * t + 1] = e3;
#endif
}

// m16n8k32 s8 -> s32 (plain and .satfinite), A 16x32 row-major, B [k][n] 32x8, C 16x8.
extern "C" __global__ void mma_s8(const signed char* a, const signed char* b, const int* c,
                                  int* d, int* dsat) {
#if __CUDA_ARCH__ >= 800
    int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    unsigned ar[4], br[2];
    for (int r = 0; r < 4; r++) {
        int row = g + 8 * (r & 1), col = 4 * t + 16 * (r >> 1);
        ar[r] = *(const unsigned*)&a[row * 32 + col];
    }
    for (int r = 0; r < 2; r++) {
        unsigned v = 0;
        for (int i = 0; i < 4; i++) {
            int k = 4 * t + i + 16 * r;
            v |= (unsigned)(unsigned char)b[k * 8 + g] << (8 * i);
        }
        br[r] = v;
    }
    int c0 = c[g * 8 + 2 * t], c1 = c[g * 8 + 2 * t + 1];
    int c2 = c[(g + 8) * 8 + 2 * t], c3 = c[(g + 8) * 8 + 2 * t + 1];
    int e[4], s[4];
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %11, %12, %13};"
        : "=r"(e[0]), "=r"(e[1]), "=r"(e[2]), "=r"(e[3])
        : "r"(ar[0]), "r"(ar[1]), "r"(ar[2]), "r"(ar[3]), "r"(br[0]), "r"(br[1]), "r"(c0),
          "r"(c1), "r"(c2), "r"(c3));
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.satfinite.s32.s8.s8.s32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
        : "=r"(s[0]), "=r"(s[1]), "=r"(s[2]), "=r"(s[3])
        : "r"(ar[0]), "r"(ar[1]), "r"(ar[2]), "r"(ar[3]), "r"(br[0]), "r"(br[1]), "r"(c0),
          "r"(c1), "r"(c2), "r"(c3));
    for (int i = 0; i < 4; i++) {
        int at = (g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1);
        d[at] = e[i];
        dsat[at] = s[i];
    }
#endif
}

// m16n8k8 tf32 -> f32, A 16x8 row-major, B [k][n] 8x8, C = 0.
extern "C" __global__ void mma_tf32(const float* a, const float* b, float* d) {
#if __CUDA_ARCH__ >= 800
    int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    unsigned ar[4], br[2];
    for (int r = 0; r < 4; r++) ar[r] = __float_as_uint(a[(g + 8 * (r & 1)) * 8 + t + 4 * (r >> 1)]);
    for (int r = 0; r < 2; r++) br[r] = __float_as_uint(b[(t + 4 * r) * 8 + g]);
    float z = 0.f, e[4];
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
        : "=f"(e[0]), "=f"(e[1]), "=f"(e[2]), "=f"(e[3])
        : "r"(ar[0]), "r"(ar[1]), "r"(ar[2]), "r"(ar[3]), "r"(br[0]), "r"(br[1]), "f"(z));
    for (int i = 0; i < 4; i++) d[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = e[i];
#endif
}

// movmatrix (transpose of an ldmatrix-loaded 8x8 tile, written back by the lanes) and, on
// sm_90, stmatrix.x4.trans of four tiles: out1 = M^T (8x8), out2 = four transposed tiles.
extern "C" __global__ void move_matrix(const half* m, half* out1, half* out2) {
#if __CUDA_ARCH__ >= 800
    __shared__ __align__(16) half sm[4 * 64];
    int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    for (int i = lane; i < 256; i += 32) sm[i] = m[i];
    __syncwarp();
    unsigned r0, r1, r2, r3, tr;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(smem(sm + lane * 8)));
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(tr) : "r"(r0));
    *(unsigned*)&out1[g * 8 + 2 * t] = tr;
    (void)r1, (void)r2, (void)r3;
#if __CUDA_ARCH__ >= 900
    __shared__ __align__(16) half so[4 * 64];
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};"
                 :: "r"(smem(so + lane * 8)), "r"(r0), "r"(r1), "r"(r2), "r"(r3));
    __syncwarp();
    for (int i = lane; i < 256; i += 32) out2[i] = so[i];
#endif
#endif
}
