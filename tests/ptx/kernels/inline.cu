// Kernels whose calls the PTX compiler inlines (crane/backends/sim/ptx/jit/inline.py) and
// extended-precision arithmetic through the carry flag (jit/ops_carry.py).

// CUDA's double-precision math keeps its slow paths out of line: sin/cos of large arguments
// reach __internal_trig_reduction_slowpathd (a chain of mad.lo.cc/madc.hi.cc over a local
// array), pow __internal_accurate_pow, lgamma __internal_lgamma_pos.
extern "C" __global__ void double_math(const double* x, double* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double v = x[i];
    out[4 * i] = sin(v);
    out[4 * i + 1] = cos(v);
    out[4 * i + 2] = pow(fabs(v) + 0.5, 1.7);
    out[4 * i + 3] = lgamma(fabs(v) * 1e-3 + 0.25);
}

// A callee with a local array indexed at run time (its own .local frame), several returns,
// called from two places with a barrier between them.
__device__ __noinline__ int digits(unsigned v, int base) {
    int buf[12];
    int n = 0;
    if (v == 0) return 1;
    while (v && n < 12) {
        buf[n++] = v % base;
        v /= base;
    }
    int s = 0;
    for (int k = 0; k < n; ++k) s = s * 3 + buf[n - 1 - k];
    if (s < 0) return -s;
    return s + n;
}

extern "C" __global__ void two_calls(const unsigned* in, int* out, int n) {
    __shared__ int mine[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int a = i < n ? digits(in[i], 7) : 0;
    mine[threadIdx.x] = a;
    __syncthreads();
    int b = digits((unsigned)mine[(threadIdx.x + 1) % blockDim.x], 10);
    if (i < n) out[i] = a * 1000 + b;
}

// 128-bit arithmetic through the carry flag: add.cc/addc, sub.cc/subc on 64-bit halves, and
// the low 128 bits of a 64x64 product from 32-bit mad.lo.cc/madc.hi.cc chains.
extern "C" __global__ void carry_chain(const unsigned long long* a, const unsigned long long* b,
                                      unsigned long long* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned long long alo = a[2 * i], ahi = a[2 * i + 1], blo = b[2 * i], bhi = b[2 * i + 1];
    unsigned long long slo, shi, dlo, dhi;
    asm("add.cc.u64 %0, %2, %4;\n\taddc.u64 %1, %3, %5;"
        : "=l"(slo), "=l"(shi) : "l"(alo), "l"(ahi), "l"(blo), "l"(bhi));
    asm("sub.cc.u64 %0, %2, %4;\n\tsubc.u64 %1, %3, %5;"
        : "=l"(dlo), "=l"(dhi) : "l"(alo), "l"(ahi), "l"(blo), "l"(bhi));
    unsigned x0 = (unsigned)alo, x1 = (unsigned)(alo >> 32);
    unsigned y0 = (unsigned)blo, y1 = (unsigned)(blo >> 32);
    unsigned p0, p1, p2, p3;
    asm("{\n\t.reg .u32 t;\n\t"
        "mul.lo.u32 %0, %4, %6;\n\t"
        "mul.hi.u32 %1, %4, %6;\n\t"
        "mad.lo.cc.u32 %1, %5, %6, %1;\n\t"
        "madc.hi.u32 %2, %5, %6, 0;\n\t"
        "mad.lo.cc.u32 %1, %4, %7, %1;\n\t"
        "madc.hi.cc.u32 %2, %4, %7, %2;\n\t"
        "addc.u32 %3, 0, 0;\n\t"
        "mad.lo.cc.u32 %2, %5, %7, %2;\n\t"
        "madc.hi.u32 %3, %5, %7, %3;\n\t}"
        : "=r"(p0), "=r"(p1), "=r"(p2), "=r"(p3)
        : "r"(x0), "r"(x1), "r"(y0), "r"(y1));
    out[6 * i] = slo;
    out[6 * i + 1] = shi;
    out[6 * i + 2] = dlo;
    out[6 * i + 3] = dhi;
    out[6 * i + 4] = ((unsigned long long)p1 << 32) | p0;
    out[6 * i + 5] = ((unsigned long long)p3 << 32) | p2;
}

// Recursion stays interpreted (a call cycle cannot be inlined).
__device__ int fib(int k) { return k < 2 ? k : fib(k - 1) + fib(k - 2); }
extern "C" __global__ void recursive(int* out) { out[threadIdx.x] = fib(threadIdx.x % 9); }
