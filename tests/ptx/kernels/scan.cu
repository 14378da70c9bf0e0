// Work-efficient (Blelloch) exclusive scan of one block of up to 2*blockDim elements,
// plus the block sums; a second kernel adds the scanned block sums.
extern "C" __global__ void scan_blocks(const int* in, int* out, int* sums, int n) {
    extern __shared__ int temp[];
    int t = threadIdx.x;
    int m = 2 * blockDim.x;
    int base = blockIdx.x * m;
    temp[2 * t] = base + 2 * t < n ? in[base + 2 * t] : 0;
    temp[2 * t + 1] = base + 2 * t + 1 < n ? in[base + 2 * t + 1] : 0;
    int offset = 1;
    for (int d = m >> 1; d > 0; d >>= 1) {
        __syncthreads();
        if (t < d) {
            int ai = offset * (2 * t + 1) - 1, bi = offset * (2 * t + 2) - 1;
            temp[bi] += temp[ai];
        }
        offset *= 2;
    }
    if (t == 0) { sums[blockIdx.x] = temp[m - 1]; temp[m - 1] = 0; }
    for (int d = 1; d < m; d *= 2) {
        offset >>= 1;
        __syncthreads();
        if (t < d) {
            int ai = offset * (2 * t + 1) - 1, bi = offset * (2 * t + 2) - 1;
            int x = temp[ai];
            temp[ai] = temp[bi];
            temp[bi] += x;
        }
    }
    __syncthreads();
    if (base + 2 * t < n) out[base + 2 * t] = temp[2 * t];
    if (base + 2 * t + 1 < n) out[base + 2 * t + 1] = temp[2 * t + 1];
}

extern "C" __global__ void scan_add(int* out, const int* scanned_sums, int n) {
    int i = blockIdx.x * 2 * blockDim.x + threadIdx.x;
    int add = scanned_sums[blockIdx.x];
    if (i < n) out[i] += add;
    if (i + blockDim.x < n) out[i + blockDim.x] += add;
}
