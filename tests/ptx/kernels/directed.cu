// Directed-rounding add, sub and mul (CUDA's __fadd_rz and friends: add.rz.f32, sub.rm.f64,
// mul.rp.f32, ...) and the math functions whose polynomials use them.
#define F32(name, expr)                                                                     \
    extern "C" __global__ void name(const float* a, const float* b, float* out, int n) {    \
        int i = blockIdx.x * blockDim.x + threadIdx.x;                                      \
        if (i < n) out[i] = expr;                                                           \
    }
#define F64(name, expr)                                                                     \
    extern "C" __global__ void name(const double* a, const double* b, double* out, int n) { \
        int i = blockIdx.x * blockDim.x + threadIdx.x;                                      \
        if (i < n) out[i] = expr;                                                           \
    }

F32(fadd_dir, __fadd_rz(a[i], b[i]) + __fadd_rd(a[i], b[i]) * 2.0f - __fadd_ru(a[i], b[i]))
F32(fsub_dir, __fsub_rz(a[i], b[i]) * 3.0f + __fsub_rd(a[i], b[i]) - __fsub_ru(a[i], b[i]))
F32(fmul_dir, __fmul_rz(a[i], b[i]) - __fmul_rd(a[i], b[i]) * 0.5f + __fmul_ru(a[i], b[i]))
F32(fadd_rz_only, __fadd_rz(a[i], b[i]))
F32(fsub_rd_only, __fsub_rd(a[i], b[i]))
F32(fmul_ru_only, __fmul_ru(a[i], b[i]))
F64(dadd_dir, __dadd_rz(a[i], b[i]) + __dadd_rd(a[i], b[i]) * 2.0 - __dadd_ru(a[i], b[i]))
F64(dsub_dir, __dsub_rz(a[i], b[i]) * 3.0 + __dsub_rd(a[i], b[i]) - __dsub_ru(a[i], b[i]))
F64(dsub_rz_only, __dsub_rz(a[i], b[i]))
F64(dadd_ru_only, __dadd_ru(a[i], b[i]))
F32(math_f32, erfinvf(a[i] * 0.999f) + lgammaf(b[i]))

// A loop of directed adds (the vector form of a region with a loop: the same rounding).
extern "C" __global__ void fadd_rz_loop(const float* a, float* out, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = 0.0f;
    for (int j = 0; j < k; j++) s = __fadd_rz(s, a[(i + j) % n]);
    out[i] = s;
}
