// Constant memory, __device__ globals with initializers, local (stack) arrays, generic pointers.
__constant__ float coef[8] = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f};
__constant__ int lookup[4];
__device__ int counter = 100;
__device__ float table[4] = {0.5f, 0.25f, 0.125f, 0.0625f};

extern "C" __global__ void use_const(const float* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float acc = 0.f;
    for (int k = 0; k < 8; ++k) acc += coef[k] * in[i] * (float)lookup[k & 3];
    out[i] = acc + table[i & 3];
    if (i == 0) atomicAdd(&counter, n);
}

extern "C" __global__ void local_array(const int* in, int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int arr[16];
    for (int k = 0; k < 16; ++k) arr[k] = in[i] * k + (k ^ i);
    int idx = in[i] & 15;
    arr[idx] += 1000;
    int s = 0;
    for (int k = 0; k < 16; ++k) s += arr[(k * 7 + idx) & 15] * (k + 1);
    out[i] = s;
}

__device__ __noinline__ void bump(int* p, int v) { *p += v; }

// One function writes through generic pointers into shared, local and global memory.
extern "C" __global__ void generic_ptrs(int* g, int n) {
    __shared__ int sh[128];
    int loc[4] = {1, 2, 3, 4};
    int t = threadIdx.x;
    sh[t] = t;
    __syncthreads();
    bump(&sh[t], 10);
    bump(&loc[t & 3], 100);
    bump(&g[t], 1000);
    __syncthreads();
    g[n + t] = sh[(t + 1) % blockDim.x] + loc[t & 3] * 7;
}
