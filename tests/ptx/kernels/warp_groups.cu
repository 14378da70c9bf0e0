// Warp-level primitives whose lanes pass different member masks at one instruction: each lane
// gets the result over the lanes of ITS mask (the cooperative-groups partitions rely on it).
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;

// out: 10 ints per thread
extern "C" __global__ void half_masks(const int* in, int* out) {
    int lane = threadIdx.x & 31;
    int v = in[blockIdx.x * blockDim.x + threadIdx.x];
    unsigned half = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    int* o = out + 10 * (blockIdx.x * blockDim.x + threadIdx.x);
#if __CUDA_ARCH__ >= 800
    o[0] = __reduce_add_sync(half, v);
    o[1] = __reduce_min_sync(half, v);
    o[2] = __reduce_max_sync(half, v);
    o[3] = (int)__reduce_or_sync(half, (unsigned)v);
#else
    o[0] = o[1] = o[2] = o[3] = -1;
#endif
    o[4] = (int)__ballot_sync(half, v & 1);
    o[5] = __all_sync(half, v >= 0);
    o[6] = __any_sync(half, v == 5);
    o[7] = (int)__match_any_sync(half, v & 3);
    int pred = 0;
    o[8] = (int)__match_all_sync(half, v >> 30, &pred);
    o[9] = pred;
}

// labeled_partition and tiled_partition with cg::reduce: the standard group-reduction pattern.
extern "C" __global__ void cg_partitions(const int* in, int* out) {
    cg::thread_block block = cg::this_thread_block();
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    int v = in[t];
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    cg::coalesced_group by_label = cg::labeled_partition(warp, v % 3);
    out[3 * t] = cg::reduce(by_label, v, cg::plus<int>());
    cg::thread_block_tile<8> tile = cg::tiled_partition<8>(block);
    out[3 * t + 1] = cg::reduce(tile, v, cg::plus<int>());
    out[3 * t + 2] = cg::reduce(by_label, v, cg::greater<int>());
}

// __syncwarp in two divergent branches: each half writes, syncs at ITS call site, then reads
// what the other half wrote (the CUDA Programming Guide's pattern for independent scheduling).
extern "C" __global__ void syncwarp_divergent(int* out) {
    __shared__ int s[64];
    int t = threadIdx.x, lane = t & 31;
    if (lane < 16) {
        s[t] = t * 10;
        __syncwarp();
        out[t] = s[t + 16];
    } else {
        s[t] = t * 7 + 1;
        __syncwarp();
        out[t] = s[t - 16] + 1000;
    }
}
