// Blocks that wait on each other through volatile memory, and warp-synchronous volatile code.
//
// lookback_scan: a single-pass inclusive scan with decoupled look-back (the scheme of CUB's
// scans and onesweep sort): each block takes its tile by an atomic ticket, publishes its
// aggregate (flag 1) with a volatile store, walks back over the tiles before it, spinning on
// volatile loads until each has published, and publishes its inclusive prefix (flag 2).
// warp_sync_sum: the legacy tail of a shared-memory sum on a volatile array without
// __syncwarp, which relies on a warp's lanes running in lockstep.

#define TILE_THREADS 128
#define ITEMS 4
#define TILE (TILE_THREADS * ITEMS)

extern "C" __global__ void lookback_scan(const unsigned* in, unsigned* out, int n,
                                         unsigned* ticket, unsigned long long* status) {
    __shared__ unsigned tile_id;
    __shared__ unsigned sums[TILE_THREADS];
    __shared__ unsigned prefix;
    int t = threadIdx.x;
    if (t == 0) tile_id = atomicAdd(ticket, 1u);
    __syncthreads();
    unsigned tile = tile_id;
    unsigned v[ITEMS];
    unsigned run = 0;
    for (int i = 0; i < ITEMS; i++) {
        int k = tile * TILE + t * ITEMS + i;
        run += k < n ? in[k] : 0u;
        v[i] = run;
    }
    sums[t] = run;
    __syncthreads();
    for (int d = 1; d < TILE_THREADS; d *= 2) {  // Hillis-Steele over the threads' totals
        unsigned x = t >= d ? sums[t - d] : 0u;
        __syncthreads();
        sums[t] += x;
        __syncthreads();
    }
    volatile unsigned long long* st = status;
    if (t == 0) {
        unsigned agg = sums[TILE_THREADS - 1];
        unsigned excl = 0;
        if (tile == 0) {
            st[0] = (2ull << 32) | agg;
        } else {
            st[tile] = (1ull << 32) | agg;
            for (int j = (int)tile - 1; j >= 0; j--) {
                unsigned long long s;
                do {
                    s = st[j];
                } while ((s >> 32) == 0);
                __threadfence();
                excl += (unsigned)s;
                if ((s >> 32) == 2) break;
            }
            __threadfence();
            st[tile] = (2ull << 32) | (excl + agg);
        }
        prefix = excl;
    }
    __syncthreads();
    unsigned before = prefix + (t > 0 ? sums[t - 1] : 0u);
    for (int i = 0; i < ITEMS; i++) {
        int k = tile * TILE + t * ITEMS + i;
        if (k < n) out[k] = before + v[i];
    }
}

extern "C" __global__ void warp_sync_sum(const unsigned* in, unsigned* out) {
    __shared__ unsigned s[64];
    int t = threadIdx.x;
    s[t] = in[blockIdx.x * 64 + t];
    __syncthreads();
    if (t < 32) {
        volatile unsigned* vs = s;
        vs[t] += vs[t + 32];
        vs[t] += vs[t + 16];
        vs[t] += vs[t + 8];
        vs[t] += vs[t + 4];
        vs[t] += vs[t + 2];
        vs[t] += vs[t + 1];
    }
    if (t == 0) out[blockIdx.x] = s[0];
}

// The whole classic reduction (the kind published samples carry): a grid-stride sum into
// shared memory, a tree with __syncthreads down to 64 values, then the warp-synchronous tail
// on a volatile array, one sum per block.
template <unsigned B>
__device__ void warp_tail(volatile unsigned* s, unsigned t) {
    if (B >= 64) s[t] += s[t + 32];
    if (B >= 32) s[t] += s[t + 16];
    if (B >= 16) s[t] += s[t + 8];
    if (B >= 8) s[t] += s[t + 4];
    if (B >= 4) s[t] += s[t + 2];
    if (B >= 2) s[t] += s[t + 1];
}

extern "C" __global__ void warp_sync_reduce(const unsigned* in, unsigned* out, unsigned n) {
    __shared__ unsigned s[256];
    unsigned t = threadIdx.x, i = blockIdx.x * 512 + t, grid = 512 * gridDim.x;
    unsigned sum = 0;
    while (i < n) {
        sum += in[i];
        if (i + 256 < n) sum += in[i + 256];
        i += grid;
    }
    s[t] = sum;
    __syncthreads();
    if (t < 128) s[t] += s[t + 128];
    __syncthreads();
    if (t < 64) s[t] += s[t + 64];
    __syncthreads();
    if (t < 32) warp_tail<64>(s, t);
    if (t == 0) out[blockIdx.x] = s[0];
}

// The lockstep order itself, one warp: every lane reads its right neighbour (wrapping) and
// its own value, then writes; a lane that wrote before another read would change the result.
// Through a generic pointer (shared or global, chosen at run time) so that nvcc emits
// ld/st.volatile on a generic address.
extern "C" __global__ void warp_sync_steps(const unsigned* in, unsigned* out, unsigned* g,
                                           int use_shared) {
    __shared__ unsigned s[32];
    volatile unsigned* vs = use_shared ? s : g;
    unsigned t = threadIdx.x;
    vs[t] = in[t];
    for (int step = 0; step < 3; step++) {
        unsigned r = vs[(t + 1) & 31];
        vs[t] = r + vs[t] * 3;
    }
    out[t] = vs[t];
}
