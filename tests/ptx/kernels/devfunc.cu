// Device functions that are not inlined: scalar args, pointer args, struct return, calls from
// divergent code and from loops, and one function calling another.
struct Pair { int lo; int hi; };

__device__ __noinline__ int poly(int x, int a, int b) { return a * x * x + b * x + 1; }

__device__ __noinline__ Pair minmax(const int* p, int n) {
    Pair r = {p[0], p[0]};
    for (int i = 1; i < n; ++i) { r.lo = min(r.lo, p[i]); r.hi = max(r.hi, p[i]); }
    return r;
}

__device__ __noinline__ float mix(float a, float b, float t) { return a + (b - a) * t; }

__device__ __noinline__ float mix2(float a, float b) { return mix(a, b, 0.25f) + mix(b, a, 0.5f); }

extern "C" __global__ void use_devfuncs(const int* in, int* out, float* fout, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = in[i];
    int r = 0;
    if (v & 1) r = poly(v, 3, -2);           // divergent call
    else r = -poly(v, 1, 1);
    for (int k = 0; k < (v & 3); ++k) r += poly(k, v, 1);
    Pair p = minmax(in + (i / 8) * 8, min(8, n - (i / 8) * 8));
    out[3 * i] = r;
    out[3 * i + 1] = p.lo;
    out[3 * i + 2] = p.hi;
    fout[i] = mix2((float)v, (float)(v * 3));
}
