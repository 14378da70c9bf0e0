// Cooperative launches compiled (crane/backends/sim/ptx/jit/coop.py): blocks that wait on later
// blocks, which only a cooperative launch (every block resident) lets end.
#include <cooperative_groups.h>
#include <cstdio>
namespace cg = cooperative_groups;

// Block 0 waits for what the grid's last block publishes: a wait on a *later* block.
extern "C" __global__ void wait_last(int* flag, int* out) {
    unsigned last = gridDim.x - 1;
    if (blockIdx.x == last && threadIdx.x == 0) {
        out[1] = 42 + (int)last;
        __threadfence();
        atomicExch(flag, 1);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        while (*(volatile int*)flag == 0) {
        }
        __threadfence();
        out[0] = out[1] + 1;
    }
}

// Waits for a flag nobody sets: ends only at the launch's deadline.
extern "C" __global__ void wait_forever(int* flag, int* out) {
    if (threadIdx.x == 0) {
        while (*(volatile int*)flag == 0) {
        }
    }
    out[blockIdx.x] = 1;
}

// Grid-stride sums (a loop in the region that reads the workspace address: its vector form),
// a block tree, a grid barrier, then every block reads all partials; thread 0 of each block
// prints its total; block `bad` then writes out of bounds (an illegal address after the sync).
extern "C" __global__ void sums(const int* in, int n, int* partial, int* out, int bad, int say) {
    __shared__ int s[256];
    cg::grid_group g = cg::this_grid();
    unsigned t = threadIdx.x, b = blockIdx.x;
    int v = 0;
    for (int i = b * blockDim.x + t; i < n; i += blockDim.x * gridDim.x) v += in[i];
    s[t] = v;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
        if (t < w) s[t] += s[t + w];
        __syncthreads();
    }
    if (t == 0) partial[b] = s[0];
    g.sync();
    int total = 0;
    for (unsigned k = 0; k < gridDim.x; k++) total += partial[k];
    out[b * blockDim.x + t] = total - partial[b];
    if (say && t == 0) printf("block %u of %u: total %d\n", b, gridDim.x, total);
    if ((int)b == bad && t == 3) out[-(1 << 28)] = 1;
}
