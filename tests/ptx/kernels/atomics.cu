// Every atomic flavour, on global and shared memory, with heavy address collisions.
extern "C" __global__ void atomics_global(const int* vals, int* ints, unsigned* uints, float* f,
                                          double* d, unsigned long long* u64, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = vals[i];
    atomicAdd(&ints[0], v);
    atomicSub(&ints[1], v);
    atomicMin(&ints[2], v);
    atomicMax(&ints[3], v);
    atomicAnd(&uints[0], (unsigned)v | 0xF0000000u);
    atomicOr(&uints[1], 1u << (v & 31));
    atomicXor(&uints[2], (unsigned)v);
    atomicInc(&uints[3], 100u);
    atomicDec(&uints[4], 50u);
    atomicMin(&uints[5], (unsigned)v);
    atomicMax(&uints[6], (unsigned)v);
    atomicAdd(&f[0], 0.5f);
    atomicAdd(&f[1 + (i & 3)], (float)(v & 255));
    atomicAdd(&d[0], (double)v * 0.25);
    atomicAdd(&u64[0], (unsigned long long)(unsigned)v * 3ull);
    atomicMax(&u64[1], (unsigned long long)(unsigned)v << 20);
    atomicMin((long long*)&u64[2], (long long)v * -7);
    // Each thread claims a unique ticket; the tickets must form a permutation.
    unsigned t = atomicAdd(&uints[7], 1u);
    uints[8 + i] = t;
}

// A CAS loop (spin until our update lands) and atomicExch.
extern "C" __global__ void atomics_cas(int* counter, int* last, int* order, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int old = *counter, assumed;
    do {
        assumed = old;
        old = atomicCAS(counter, assumed, assumed + 2);
    } while (old != assumed);
    order[i] = old;
    atomicExch(last, i);
}

// Shared-memory atomics and __syncthreads_count/and/or.
extern "C" __global__ void atomics_shared(const int* vals, int* out, int n) {
    __shared__ int acc[4];
    __shared__ unsigned long long acc64;
    int t = threadIdx.x;
    if (t < 4) acc[t] = t == 2 ? 0x7fffffff : 0;
    if (t == 0) acc64 = 0;
    __syncthreads();
    int i = blockIdx.x * blockDim.x + t;
    int v = i < n ? vals[i] : 0;
    atomicAdd(&acc[0], v);
    atomicMax(&acc[1], v);
    atomicMin(&acc[2], v);
    atomicXor(&acc[3], v);
    atomicAdd(&acc64, (unsigned long long)(v & 0xffff));
    int cnt = __syncthreads_count(v > 0);
    int all = __syncthreads_and(v > -1000);
    int any = __syncthreads_or(v == 12345);
    if (t == 0) {
        int* o = out + 8 * blockIdx.x;
        o[0] = acc[0]; o[1] = acc[1]; o[2] = acc[2]; o[3] = acc[3];
        o[4] = (int)acc64; o[5] = cnt; o[6] = all; o[7] = any;
    }
}

// Compare-and-swap retries emulating atomics the hardware lacks (PyTorch's gpuAtomicMax has
// this shape): a float max, a double multiply, a 16-bit add through the enclosing word.
__device__ float cas_max_float(float* addr, float val) {
    int* a = (int*)addr;
    int old = *a, assumed;
    do {
        assumed = old;
        old = atomicCAS(a, assumed, __float_as_int(fmaxf(val, __int_as_float(assumed))));
    } while (assumed != old);
    return __int_as_float(old);
}

extern "C" __global__ void cas_retries(const float* in, float* fmax, double* prod,
                                       unsigned short* sums, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    cas_max_float(fmax, in[i]);
    unsigned long long* a = (unsigned long long*)(prod + (i & 7));
    unsigned long long old = *a, assumed;
    do {
        assumed = old;
        double v = __longlong_as_double(assumed) * (1.0 + in[i] * 1e-3);
        old = atomicCAS(a, assumed, __double_as_longlong(v));
    } while (assumed != old);
    unsigned short* p = sums + (i & 3);
    unsigned* word = (unsigned*)((size_t)p & ~(size_t)3);
    unsigned shift = ((size_t)p & 2) ? 16 : 0, w = *word, seen;
    do {
        seen = w;
        unsigned v = ((seen >> shift) + (unsigned)(in[i] * 100.0f)) & 0xffffu;
        w = atomicCAS(word, seen, (seen & ~(0xffffu << shift)) | (v << shift));
    } while (seen != w);
}

// A spin lock: thread 0 of each block waits until no other block holds it (a wait on
// another thread, unlike a retry: stays interpreted).
extern "C" __global__ void cas_lock(int* lock, int* count) {
    if (threadIdx.x == 0) {
        while (atomicCAS(lock, 0, 1) != 0) {
        }
        *(volatile int*)count += 1;
        __threadfence();
        atomicExch(lock, 0);
    }
}
