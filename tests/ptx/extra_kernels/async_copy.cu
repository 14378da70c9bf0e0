// cuda::barrier, cuda::memcpy_async and cuda::pipeline (libcu++): built for compute_80 they
// use mbarrier and cp.async; for compute_90 also mbarrier.try_wait, expect_tx and
// cp.async.bulk. Each kernel writes results the test checks against the host.
#include <cooperative_groups.h>
#include <cuda/barrier>
#include <cuda/pipeline>

namespace cg = cooperative_groups;
using block_barrier = cuda::barrier<cuda::thread_scope_block>;

// Phases of a block barrier: every thread publishes a value, waits, reads its neighbour's.
extern "C" __global__ void barrier_phases(const int *in, int *out, int rounds) {
    __shared__ block_barrier bar;
    __shared__ int s[256];
    int t = threadIdx.x, n = blockDim.x;
    if (t == 0) init(&bar, n);
    __syncthreads();
    int v = in[blockIdx.x * n + t];
    for (int r = 0; r < rounds; r++) {
        s[t] = v;
        bar.arrive_and_wait();
        int next = s[(t + 1) % n];
        auto token = bar.arrive();  // split arrive / wait
        bar.wait(std::move(token));
        v += next;
    }
    out[blockIdx.x * n + t] = v;
}

// memcpy_async of a tile into shared memory, completed through a barrier.
extern "C" __global__ void memcpy_barrier(const float *in, float *out, int tiles) {
    __shared__ alignas(16) float tile[512];
    __shared__ block_barrier bar;
    auto block = cg::this_thread_block();
    if (block.thread_rank() == 0) init(&bar, block.size());
    block.sync();
    float acc = 0.f;
    for (int k = 0; k < tiles; k++) {
        const float *src = in + ((size_t)blockIdx.x * tiles + k) * 512;
        cuda::memcpy_async(block, tile, src, cuda::aligned_size_t<16>(sizeof(tile)), bar);
        bar.arrive_and_wait();
        acc += tile[block.thread_rank()] * (k + 1) + tile[511 - block.thread_rank()];
        bar.arrive_and_wait();  // everyone has read the tile before it is overwritten
    }
    out[blockIdx.x * block.size() + block.thread_rank()] = acc;
}

// A per-thread two-stage pipeline (cp.async + commit/wait groups).
extern "C" __global__ void thread_pipeline(const int4 *in, int *out, int chunks) {
    __shared__ int4 buf[2][128];
    auto pipe = cuda::make_pipeline();
    int t = threadIdx.x;
    const int4 *base = in + (size_t)blockIdx.x * chunks * blockDim.x;
    int sum = 0;
    pipe.producer_acquire();
    cuda::memcpy_async(&buf[0][t], base + t, sizeof(int4), pipe);
    pipe.producer_commit();
    for (int c = 0; c < chunks; c++) {
        if (c + 1 < chunks) {
            pipe.producer_acquire();
            cuda::memcpy_async(&buf[(c + 1) & 1][t], base + (c + 1) * blockDim.x + t,
                               sizeof(int4), pipe);
            pipe.producer_commit();
        }
        pipe.consumer_wait();
        int4 v = buf[c & 1][t];
        sum += v.x + 2 * v.y + 3 * v.z + 4 * v.w;
        pipe.consumer_release();
    }
    out[blockIdx.x * blockDim.x + t] = sum;
}

// A block-scope pipeline with producer and consumer roles: warp 0 copies, the other warps
// compute. The consumers' waits come first in the code.
constexpr int STAGES = 2;
extern "C" __global__ void role_pipeline(const float *in, float *out, int chunks) {
    __shared__ alignas(16) float buf[STAGES][256];
    __shared__ cuda::pipeline_shared_state<cuda::thread_scope_block, STAGES> state;
    auto block = cg::this_thread_block();
    const bool producer = block.thread_rank() < 32;
    const auto role = producer ? cuda::pipeline_role::producer : cuda::pipeline_role::consumer;
    auto pipe = cuda::make_pipeline(block, &state, role);
    const float *src = in + (size_t)blockIdx.x * chunks * 256;
    if (!producer) {
        int c_idx = block.thread_rank() - 32;  // 0..(n-33)
        float acc = 0.f;
        for (int c = 0; c < chunks; c++) {
            pipe.consumer_wait();
            for (int i = c_idx; i < 256; i += block.size() - 32) acc += buf[c % STAGES][i];
            pipe.consumer_release();
        }
        out[blockIdx.x * block.size() + block.thread_rank()] = acc;
    } else {
        for (int c = 0; c < chunks; c++) {
            pipe.producer_acquire();
            for (int i = block.thread_rank(); i < 256; i += 32)
                cuda::memcpy_async(&buf[c % STAGES][i], src + c * 256 + i, sizeof(float), pipe);
            pipe.producer_commit();
        }
        out[blockIdx.x * block.size() + block.thread_rank()] = 0.f;
    }
}
