// Bitonic sort of each 1024-element (or blockDim*2) segment in shared memory.
extern "C" __global__ void bitonic_block(float* data) {
    extern __shared__ float s[];
    unsigned t = threadIdx.x, m = 2 * blockDim.x;
    float* d = data + blockIdx.x * m;
    s[t] = d[t];
    s[t + blockDim.x] = d[t + blockDim.x];
    __syncthreads();
    for (unsigned size = 2; size <= m; size <<= 1) {
        for (unsigned stride = size >> 1; stride > 0; stride >>= 1) {
            unsigned pos = 2 * t - (t & (stride - 1));
            bool up = ((pos & size) == 0);
            float a = s[pos], b = s[pos + stride];
            if ((a > b) == up) { s[pos] = b; s[pos + stride] = a; }
            __syncthreads();
        }
    }
    d[t] = s[t];
    d[t + blockDim.x] = s[t + blockDim.x];
}

// One global compare-exchange step (the host loops over j, k).
extern "C" __global__ void bitonic_step(unsigned* data, int j, int k) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned ixj = i ^ j;
    if (ixj > i) {
        unsigned a = data[i], b = data[ixj];
        if ((i & k) == 0 ? a > b : a < b) { data[i] = b; data[ixj] = a; }
    }
}
