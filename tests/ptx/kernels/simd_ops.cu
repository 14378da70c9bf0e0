// Loops whose bodies hold bit instructions (popc, clz, brev, bfind, bfe, prmt, lop3, shf), which
// the vector form of a region with a loop (jit/simd.py) runs on W lanes at once, and the special
// functions (ex2, lg2, sin, cos, tanh .approx), which keep the scalar rounds. Trip counts differ
// per lane.
extern "C" __global__ void bits_loop(const unsigned* in, unsigned* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned h = in[i], acc = 0;
    for (int k = 0; k < (i % 7) + 3; k++) {
        unsigned x = h ^ (k * 0x9E3779B9u);
        acc += __popc(x) + __clz(x | 1u) + (__brev(x) >> 7);
        acc ^= __byte_perm(x, acc, 0x3210 + (k & 3) * 0x0101);
        acc += __funnelshift_l(x, acc, k) ^ __funnelshift_r(acc, x, k + 3);
        unsigned f;
        asm("bfe.u32 %0, %1, %2, %3;" : "=r"(f) : "r"(x), "r"(k & 15), "r"(9));
        acc += f;
        int s;
        asm("bfe.s32 %0, %1, %2, %3;" : "=r"(s) : "r"(x), "r"(3), "r"((k & 7) + 1));
        acc += (unsigned)s;
        unsigned hb;
        asm("bfind.u32 %0, %1;" : "=r"(hb) : "r"(x >> (k & 31)));
        acc += hb;
        unsigned m;
        asm("lop3.b32 %0, %1, %2, %3, 0xE8;" : "=r"(m) : "r"(acc), "r"(x), "r"(h));
        acc = m + (acc >> 3);
        h = h * 1664525u + 1013904223u;
    }
    out[i] = acc;
}

extern "C" __global__ void sfu_loop(const float* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = in[i], acc = 0.0f;
    for (int k = 0; k < (i % 5) + 2; k++) {
        float y = x * (0.25f + 0.125f * k);
        acc += __expf(y) + __logf(fabsf(y) + 1.0f) + __sinf(y) * __cosf(y);
        float t;
        asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(y));
        acc += t;
    }
    out[i] = acc;
}
