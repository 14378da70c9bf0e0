// Dynamic shared memory (extern __shared__) combined with a static shared array: reverse
// each block's segment and add a per-block constant staged in static shared memory.
extern "C" __global__ void reverse_dyn(const int* in, int* out, int n) {
    extern __shared__ int buf[];
    __shared__ int bias;
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    if (t == 0) bias = blockIdx.x * 1000;
    buf[t] = i < n ? in[i] : 0;
    __syncthreads();
    int j = blockIdx.x * blockDim.x + (blockDim.x - 1 - t);
    if (j < n) out[j] = buf[t] + bias;
}

// Dynamic shared memory viewed as two differently-typed arrays.
extern "C" __global__ void dyn_two_arrays(const float* in, float* out, int n) {
    extern __shared__ unsigned char raw[];
    double* d = (double*)raw;
    float* f = (float*)(raw + blockDim.x * sizeof(double));
    int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + t;
    float x = i < n ? in[i] : 0.0f;
    d[t] = (double)x * 2.0;
    f[t] = x + 1.0f;
    __syncthreads();
    int o = (t + 1) % blockDim.x;
    if (i < n) out[i] = (float)d[o] + f[o];
}
