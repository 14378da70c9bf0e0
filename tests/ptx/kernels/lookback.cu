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
