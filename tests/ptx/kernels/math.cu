// Single and double precision math, IEEE and approximate.
extern "C" __global__ void math_f32(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = a[i], y = b[i];
    float* o = out + 16 * i;
    o[0] = x / y;
    o[1] = sqrtf(fabsf(x));
    o[2] = fmaf(x, y, -x);
    o[3] = __fdividef(x, y);
    o[4] = rsqrtf(fabsf(x) + 1.0f);
    o[5] = __expf(y * 0.1f);
    o[6] = __logf(fabsf(x) + 1.0f);
    o[7] = __sinf(y);
    o[8] = __cosf(y);
    o[9] = expf(y * 0.1f);
    o[10] = logf(fabsf(x) + 1.0f);
    o[11] = sinf(y);
    o[12] = fminf(x, y) + fmaxf(x, -y);
    o[13] = copysignf(x, y);
    o[14] = __frcp_rn(y);
    o[15] = (x > y) ? x - y : -(x * y);
}

extern "C" __global__ void math_f64(const double* a, const double* b, double* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double x = a[i], y = b[i];
    double* o = out + 8 * i;
    o[0] = x / y;
    o[1] = sqrt(fabs(x));
    o[2] = fma(x, y, -x);
    o[3] = 1.0 / y;
    o[4] = fmin(x, y) - fmax(x, y);
    o[5] = exp(y * 0.01);
    o[6] = log(fabs(x) + 1.0);
    o[7] = rsqrt(fabs(x) + 1.0);
}

// double trig: arguments past about 2^20 take libdevice's Payne-Hanek slow path (a call, a
// .local table walk and 32-bit multiply-add carry chains)
extern "C" __global__ void trig_f64(const double* a, double* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double x = a[i];
    out[3 * i] = sin(x);
    out[3 * i + 1] = cos(x);
    out[3 * i + 2] = pow(fabs(x) + 1.0, 0.75);
}

extern "C" __global__ void fma_exact(const float* a, const float* b, const float* c, float* out,
                                     const double* da, const double* db, const double* dc,
                                     double* dout, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = fmaf(a[i], b[i], c[i]);
    dout[i] = fma(da[i], db[i], dc[i]);
}
