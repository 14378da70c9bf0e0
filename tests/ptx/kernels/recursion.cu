// Recursion: direct (two call sites), mutual, with a per-activation local array, with lanes
// of one warp at different depths, and deep enough to overflow the call stack.
__device__ __noinline__ int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

__device__ __noinline__ bool is_odd(int n);
__device__ __noinline__ bool is_even(int n) { return n == 0 ? true : is_odd(n - 1); }
__device__ __noinline__ bool is_odd(int n) { return n == 0 ? false : is_even(n - 1); }

// each activation keeps an indexed local array across the recursive call
__device__ __noinline__ int digits_sum(int n, int depth) {
    volatile int buf[4];
    for (int k = 0; k < 4; ++k) buf[k] = n * (k + 1) + depth;
    int below = n >= 10 ? digits_sum(n / 10, depth + 1) : 0;
    int mine = buf[(n + depth) & 3] - (n * (((n + depth) & 3) + 1)) - depth;  // 0 if kept
    return below + (n % 10) + mine;
}

// not a tail call: the volatile local lives across the call, so each level keeps a frame
__device__ __noinline__ long long depth_sum(long long n) {
    if (n == 0) return 0;
    volatile long long keep = n;
    long long below = depth_sum(n - 1);
    return below + keep;
}

extern "C" __global__ void use_recursion(const int* in, int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        int v = in[i];
        out[4 * i + 0] = fib(v % 20);
        out[4 * i + 1] = is_even(v % 500) ? 1 : 0;
        out[4 * i + 2] = digits_sum(v, 0);
        out[4 * i + 3] = (int)depth_sum(v % 50);
    }
}

extern "C" __global__ void deep(long long n, long long* out) { *out = depth_sum(n); }
