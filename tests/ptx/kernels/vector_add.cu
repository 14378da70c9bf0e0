// Element-wise kernels: the simplest 1-D grid pattern with a bounds check.
extern "C" __global__ void vadd_f32(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void vadd_i64(const long long* a, const long long* b, long long* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void vops_f64(const double* a, const double* b, double* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = (a[i] * b[i] - a[i]) / (b[i] + 3.0);
}

extern "C" __global__ void saxpy(int n, float alpha, const float* x, float* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = alpha * x[i] + y[i];
}

// Grid-stride loop over a 2-D grid of 2-D blocks.
extern "C" __global__ void scale2d(float* data, int w, int h, float s) {
    for (int y = blockIdx.y * blockDim.y + threadIdx.y; y < h; y += blockDim.y * gridDim.y)
        for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < w; x += blockDim.x * gridDim.x)
            data[y * w + x] = data[y * w + x] * s + (float)(x - y);
}

// Writes every special register of each thread of a 3-D launch.
extern "C" __global__ void ids3d(unsigned* out) {
    unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned bid = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned nthreads = blockDim.x * blockDim.y * blockDim.z;
    unsigned* o = out + 8 * (bid * nthreads + tid);
    o[0] = threadIdx.x; o[1] = threadIdx.y; o[2] = threadIdx.z;
    o[3] = blockIdx.x;  o[4] = blockIdx.y;  o[5] = blockIdx.z;
    unsigned lane;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane));
    o[6] = lane;
    o[7] = gridDim.x * 1000000 + gridDim.y * 1000 + gridDim.z + blockDim.x * blockDim.y * blockDim.z;
}
