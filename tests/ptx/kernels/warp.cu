// Warp-level primitives.
extern "C" __global__ void warp_reduce(const int* in, int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = i < n ? in[i] : 0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) out[i / 32] = v;
}

extern "C" __global__ void warp_ops(const int* in, int* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = in[i];
    int lane = threadIdx.x & 31;
    int* o = out + 12 * i;
    int x = v;
    for (int m = 1; m < 32; m <<= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
    o[0] = x;                                                  // butterfly sum
    int s = v;
    for (int d = 1; d < 32; d <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, s, d);
        if (lane >= d) s += y;
    }
    o[1] = s;                                                  // inclusive scan
    o[2] = __shfl_sync(0xffffffffu, v, 7);                     // broadcast
    o[3] = __shfl_sync(0xffffffffu, v, (lane + 3) & 31);       // rotate
    o[4] = __shfl_down_sync(0xffffffffu, v, 5, 8);             // width 8 segments
    o[5] = (int)__ballot_sync(0xffffffffu, v & 1);
    o[6] = __any_sync(0xffffffffu, v == 77);
    o[7] = __all_sync(0xffffffffu, v >= 0);
    unsigned act = 0;
    if (v & 2) act = __activemask();                           // divergent activemask
    o[8] = (int)act;
    o[9] = __popc(__ballot_sync(0xffffffffu, v > 50));
    o[10] = __shfl_xor_sync(0xffffffffu, v, 4, 16);
#if __CUDA_ARCH__ >= 800
    o[11] = __reduce_max_sync(0xffffffffu, v) + __reduce_add_sync(0xffffffffu, v & 15);
#else
    o[11] = -1;
#endif
}

// A partial mask: only the even lanes take part.
extern "C" __global__ void warp_partial(const int* in, int* out) {
    int lane = threadIdx.x & 31;
    int v = in[threadIdx.x];
    int r = -1;
    if ((lane & 1) == 0) {
        r = __shfl_sync(0x55555555u, v, lane + 2 & 31) + (int)__ballot_sync(0x55555555u, v > 10);
    }
    out[threadIdx.x] = r;
}
