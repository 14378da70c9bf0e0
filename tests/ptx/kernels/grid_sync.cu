// Grid-wide synchronization (cooperative_groups this_grid().sync()): needs a cooperative launch.
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

// Two phases: every thread writes, the grid syncs, every thread reads other blocks' writes.
extern "C" __global__ void two_phase(int* a, int* out, int n) {
    cg::grid_group g = cg::this_grid();
    unsigned i = g.thread_rank();
    if (i < n) a[i] = i * 3 + 1;
    g.sync();
    if (i < n) out[i] = a[n - 1 - i] + a[(i + blockDim.x) % n];
}

// Blocks arrive at the grid barrier late and unevenly: block b first runs b rounds of block
// barriers, so when early blocks spin at the grid barrier, late ones still wait at bar.sync.
extern "C" __global__ void staggered(const int* in, int* partial, int* out) {
    __shared__ int s[128];  // blockDim.x == 128
    cg::grid_group g = cg::this_grid();
    unsigned t = threadIdx.x, b = blockIdx.x;
    int v = in[b * blockDim.x + t];
    for (unsigned r = 0; r < b; r++) {
        s[t] = v;
        __syncthreads();
        v = (v + s[(t + 1) % blockDim.x]) & 0xFFFF;
        __syncthreads();
    }
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
    out[b * blockDim.x + t] = total + partial[(b + 1) % gridDim.x];
}

// Many grid barriers in a loop (the workspace counter flips phase each time): a 1-D smoothing
// stencil ping-ponging between two buffers, with block-dependent extra work between barriers.
extern "C" __global__ void stencil(int* x, int* y, int n, int iters) {
    cg::grid_group g = cg::this_grid();
    unsigned i = g.thread_rank();
    for (int k = 0; k < iters; k++) {
        int* src = (k & 1) ? y : x;
        int* dst = (k & 1) ? x : y;
        if (i < n) {
            int v = src[i] * 2 + src[(i + n - 1) % n] + src[(i + 1) % n];
            for (unsigned r = 0; r < blockIdx.x % 3; r++) v = v ^ (r << 20) ^ (r << 20);
            dst[i] = v % 1000003;
        }
        g.sync();
    }
}

// grid.is_valid(): true only in a cooperative launch (the workspace pointer is set).
extern "C" __global__ void grid_valid(int* out) {
    cg::grid_group g = cg::this_grid();
    if (g.thread_rank() == 0) out[0] = g.is_valid();
}

// No grid sync: a cheap kernel for the launch-limit checks.
extern "C" __global__ void tag(int* out) {
    if (threadIdx.x == 0) out[blockIdx.x] = blockIdx.x + 1;
}
