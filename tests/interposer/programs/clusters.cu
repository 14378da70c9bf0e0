// Thread-block clusters end to end (build for compute_90): a __cluster_dims__ kernel launched
// with <<<>>>, cudaLaunchKernelEx with cudaLaunchAttributeClusterDimension (2D clusters, a
// non-portable 16-block cluster), cooperative_groups::this_cluster() (sync, map_shared_rank,
// block_rank, block_index, num_blocks, num_threads, dim_blocks), the launches the driver refuses, and
// cudaOccupancyMaxActiveClusters / MaxPotentialClusterSize, each against the host's answer.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "check.h"

namespace cg = cooperative_groups;

// Each block fills its shared array, then reads its right neighbour's (rank + 1) through
// distributed shared memory; the second sync keeps every block's shared memory alive until
// all reads are done.
__global__ void __cluster_dims__(2, 1, 1) ring(int *out, unsigned *info) {
    __shared__ int sm[128];
    cg::cluster_group cl = cg::this_cluster();
    unsigned r = cl.block_rank();
    sm[threadIdx.x] = r * 1000 + threadIdx.x + blockIdx.x * 7;
    cl.sync();
    int *remote = cl.map_shared_rank(sm, (r + 1) % cl.num_blocks());
    out[blockIdx.x * blockDim.x + threadIdx.x] = remote[threadIdx.x];
    if (threadIdx.x == 0) {
        dim3 d = cl.dim_blocks();
        unsigned *p = info + blockIdx.x * 5;
        p[0] = r;
        p[1] = cl.num_blocks();
        p[2] = d.x;
        p[3] = d.y;
        p[4] = cl.num_threads() == 2 * blockDim.x;
    }
    cl.sync();
}

constexpr int kBins = 16;  // bins per block: the cluster's histogram is split over its blocks

// A histogram of the cluster's input slice kept in distributed shared memory: value v goes
// to bin v % kBins of the block of rank (v / kBins) % nranks, by atomics on that block's
// shared memory; each block then writes its own bins.
__global__ void dist_hist(const unsigned *in, unsigned *out, unsigned *where) {
    __shared__ unsigned hist[kBins];
    cg::cluster_group cl = cg::this_cluster();
    unsigned nranks = cl.num_blocks();
    for (unsigned i = threadIdx.x; i < kBins; i += blockDim.x) hist[i] = 0;
    cl.sync();
    unsigned bid = blockIdx.y * gridDim.x + blockIdx.x;
    unsigned v = in[bid * blockDim.x + threadIdx.x];
    unsigned *dst = cl.map_shared_rank(hist, (v / kBins) % nranks);
    atomicAdd(&dst[v % kBins], 1u);
    cl.sync();
    dim3 d = cl.dim_blocks();
    unsigned cx = blockIdx.x / d.x, cy = blockIdx.y / d.y, ncx = gridDim.x / d.x;
    unsigned cid = cy * ncx + cx;
    for (unsigned i = threadIdx.x; i < kBins; i += blockDim.x)
        out[(cid * nranks + cl.block_rank()) * kBins + i] = hist[i];
    if (threadIdx.x == 0) {
        dim3 bi = cl.block_index();
        unsigned *p = where + bid * 3;
        p[0] = cid;
        p[1] = bi.x;
        p[2] = bi.y;
    }
}

static cudaError_t launch_hist(dim3 grid, dim3 block, dim3 cluster, const unsigned *in,
                               unsigned *out, unsigned *where, cudaStream_t stream = 0) {
    cudaLaunchConfig_t cfg = {};
    cfg.stream = stream;
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster.x;
    attr[0].val.clusterDim.y = cluster.y;
    attr[0].val.clusterDim.z = cluster.z;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, dist_hist, in, out, where);
}

// graph: the launch is captured into a graph, which then runs twice (the kernel node keeps the
// cluster dimensions)
static void check_hist(dim3 grid, dim3 block, dim3 cluster, bool graph = false) {
    unsigned nblocks = grid.x * grid.y, n = nblocks * block.x;
    unsigned nranks = cluster.x * cluster.y, nclusters = nblocks / nranks;
    std::vector<unsigned> in(n);
    for (unsigned i = 0; i < n; i++) in[i] = (i * 2654435761u) >> 7;
    unsigned *din, *dout, *dwhere;
    cudaMalloc(&din, n * 4);
    cudaMalloc(&dout, nclusters * nranks * kBins * 4);
    cudaMalloc(&dwhere, nblocks * 12);
    cudaMemcpy(din, in.data(), n * 4, cudaMemcpyHostToDevice);
    cudaError_t e;
    if (graph) {
        cudaStream_t st;
        cudaGraph_t g;
        cudaGraphExec_t ge;
        cudaStreamCreate(&st);
        cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
        e = launch_hist(grid, block, cluster, din, dout, dwhere, st);
        CHECK(e == cudaSuccess, "captured launch: %s", cudaGetErrorString(e));
        CHECK(cudaStreamEndCapture(st, &g) == cudaSuccess, "end capture");
        cudaGraphNode_t node;
        size_t nnodes = 1;
        CHECK(cudaGraphGetNodes(g, &node, &nnodes) == cudaSuccess && nnodes == 1, "nodes");
        cudaKernelNodeAttrValue v = {};
        e = cudaGraphKernelNodeGetAttribute(node, cudaKernelNodeAttributeClusterDimension, &v);
        CHECK(e == cudaSuccess && v.clusterDim.x == cluster.x && v.clusterDim.y == cluster.y &&
                  v.clusterDim.z == 1,
              "node cluster %ux%ux%u (%s)", v.clusterDim.x, v.clusterDim.y, v.clusterDim.z,
              cudaGetErrorName(e));
        CHECK(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess, "instantiate");
        cudaMemset(dout, 0xff, nclusters * nranks * kBins * 4);
        for (int k = 0; k < 2; k++) e = cudaGraphLaunch(ge, st);
        CHECK(e == cudaSuccess, "graph launch: %s", cudaGetErrorString(e));
        cudaStreamSynchronize(st);
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
        cudaStreamDestroy(st);
    } else {
        e = launch_hist(grid, block, cluster, din, dout, dwhere);
        CHECK(e == cudaSuccess, "cluster %ux%u launch: %s", cluster.x, cluster.y,
              cudaGetErrorString(e));
    }
    e = cudaDeviceSynchronize();
    CHECK(e == cudaSuccess, "cluster %ux%u run: %s", cluster.x, cluster.y, cudaGetErrorString(e));
    std::vector<unsigned> got(nclusters * nranks * kBins), where(nblocks * 3);
    cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(where.data(), dwhere, where.size() * 4, cudaMemcpyDeviceToHost);
    std::vector<unsigned> want(got.size(), 0);
    int bad = 0, bad_where = 0;
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            unsigned bid = by * grid.x + bx;
            unsigned cid = (by / cluster.y) * (grid.x / cluster.x) + bx / cluster.x;
            if (where[bid * 3] != cid || where[bid * 3 + 1] != bx % cluster.x ||
                where[bid * 3 + 2] != by % cluster.y)
                bad_where++;
            for (unsigned t = 0; t < block.x; t++) {
                unsigned v = in[bid * block.x + t];
                want[(cid * nranks + (v / kBins) % nranks) * kBins + v % kBins]++;
            }
        }
    for (size_t i = 0; i < got.size(); i++) bad += got[i] != want[i];
    CHECK(bad == 0, "cluster %ux%u histogram: %d bins differ", cluster.x, cluster.y, bad);
    CHECK(bad_where == 0, "cluster %ux%u block_index/cluster id: %d blocks differ", cluster.x,
          cluster.y, bad_where);
    cudaFree(din);
    cudaFree(dout);
    cudaFree(dwhere);
}

// The occupancy rule the answers are checked against, from the device's properties: blocks
// per SM limited by blocks, warps and shared memory; a cluster's blocks on one GPC of 18 SMs.
static int host_active_clusters(const cudaDeviceProp &p, int threads, size_t smem, int size) {
    int warps = (threads + 31) / 32 * 32;
    int per_sm = p.maxBlocksPerMultiProcessor;
    if (p.maxThreadsPerMultiProcessor / warps < per_sm) per_sm = p.maxThreadsPerMultiProcessor / warps;
    if (smem) {
        int by_smem = (int)(p.sharedMemPerMultiprocessor / (smem + p.reservedSharedMemPerBlock));
        if (by_smem < per_sm) per_sm = by_smem;
    }
    int gpcs = p.multiProcessorCount / 18, rest = p.multiProcessorCount % 18;
    return gpcs * (per_sm * 18 / size) + per_sm * rest / size;
}

int main() {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0) == cudaSuccess, "properties");
    int can = 0;
    cudaDeviceGetAttribute(&can, cudaDevAttrClusterLaunch, 0);
    CHECK(can == 1 && prop.major >= 9, "cluster launch %d on %d.%d", can, prop.major, prop.minor);

    // __cluster_dims__(2,1,1) through <<<>>>
    const int blocks = 6, threads = 128;
    int *dout;
    unsigned *dinfo;
    cudaMalloc(&dout, blocks * threads * 4);
    cudaMalloc(&dinfo, blocks * 5 * 4);
    ring<<<blocks, threads>>>(dout, dinfo);
    cudaError_t e = cudaDeviceSynchronize();
    CHECK(e == cudaSuccess, "ring: %s", cudaGetErrorString(e));
    std::vector<int> out(blocks * threads);
    std::vector<unsigned> info(blocks * 5);
    cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(info.data(), dinfo, info.size() * 4, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int b = 0; b < blocks; b++) {
        int r = b % 2, nb = b - r + (r + 1) % 2;
        for (int t = 0; t < threads; t++) bad += out[b * threads + t] != ((r + 1) % 2) * 1000 + t + nb * 7;
        CHECK(info[b * 5] == (unsigned)r && info[b * 5 + 1] == 2 && info[b * 5 + 2] == 2 &&
                  info[b * 5 + 3] == 1 && info[b * 5 + 4] == 1,
              "block %d: rank %u of %u, dims %ux%u, threads ok %u", b, info[b * 5], info[b * 5 + 1],
              info[b * 5 + 2], info[b * 5 + 3], info[b * 5 + 4]);
    }
    CHECK(bad == 0, "ring: %d values differ", bad);
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, ring) == cudaSuccess, "ring attributes");
    CHECK(fa.requiredClusterWidth == 2 && fa.requiredClusterHeight == 1 &&
              fa.requiredClusterDepth == 1 && fa.clusterDimMustBeSet == 1,
          "ring's compiled cluster %dx%dx%d must-be-set %d", fa.requiredClusterWidth,
          fa.requiredClusterHeight, fa.requiredClusterDepth, fa.clusterDimMustBeSet);
    e = cudaFuncSetAttribute(ring, cudaFuncAttributeRequiredClusterWidth, 4);
    CHECK(e == cudaErrorNotPermitted, "resetting a compiled cluster width: %s",
          cudaGetErrorName(e));
    cudaGetLastError();
    {  // the occupancy queries take the compiled shape when the configuration names none
        cudaLaunchConfig_t rc = {};
        rc.gridDim = dim3(6);
        rc.blockDim = dim3(threads);
        int n = -1;
        e = cudaOccupancyMaxActiveClusters(&n, ring, &rc);
        int want = host_active_clusters(prop, threads, 128 * 4, 2);
        CHECK(e == cudaSuccess && n == want, "ring active clusters %d (%s), host %d", n,
              cudaGetErrorName(e), want);
    }
    printf("ring %s\n", bad ? "bad" : "ok");

    // cudaLaunchKernelEx with cluster dimensions
    check_hist(dim3(8, 4), dim3(64), dim3(2, 2, 1));
    check_hist(dim3(16, 2), dim3(96), dim3(8, 1, 1));
    check_hist(dim3(4, 4), dim3(64), dim3(1, 4, 1), true);

    // refusals: a grid not made of whole clusters, more than 8 blocks without opting in
    unsigned *dummy;
    cudaMalloc(&dummy, 1 << 16);
    e = launch_hist(dim3(6, 1), dim3(32), dim3(4, 1, 1), dummy, dummy, dummy);
    CHECK(e == cudaErrorInvalidClusterSize, "6 blocks in clusters of 4: %s", cudaGetErrorName(e));
    cudaGetLastError();
    e = launch_hist(dim3(16, 1), dim3(32), dim3(16, 1, 1), dummy, dummy, dummy);
    CHECK(e == cudaErrorInvalidClusterSize, "16 portable: %s", cudaGetErrorName(e));
    cudaGetLastError();

    // occupancy
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(8, 4);
    cfg.blockDim = dim3(256);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2;
    attr[0].val.clusterDim.y = 2;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int nclusters = -1;
    e = cudaOccupancyMaxActiveClusters(&nclusters, dist_hist, &cfg);
    int want = host_active_clusters(prop, 256, kBins * 4, 4);
    CHECK(e == cudaSuccess && nclusters == want, "max active 2x2 clusters %d (%s), host %d",
          nclusters, cudaGetErrorName(e), want);
    cfg.dynamicSmemBytes = 100 * 1024;
    cudaFuncSetAttribute(dist_hist, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024);
    e = cudaOccupancyMaxActiveClusters(&nclusters, dist_hist, &cfg);
    want = host_active_clusters(prop, 256, kBins * 4 + 100 * 1024, 4);
    CHECK(e == cudaSuccess && nclusters == want, "with 100 KiB %d (%s), host %d", nclusters,
          cudaGetErrorName(e), want);
    cfg.dynamicSmemBytes = 0;
    cfg.numAttrs = 0;
    int size = -1;
    e = cudaOccupancyMaxPotentialClusterSize(&size, dist_hist, &cfg);
    CHECK(e == cudaSuccess && size == 8, "potential cluster size %d (%s)", size,
          cudaGetErrorName(e));
    CHECK(cudaFuncSetAttribute(dist_hist, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
              cudaSuccess,
          "non-portable");
    e = cudaOccupancyMaxPotentialClusterSize(&size, dist_hist, &cfg);
    CHECK(e == cudaSuccess && size == 16, "non-portable potential size %d (%s)", size,
          cudaGetErrorName(e));
    printf("occupancy %d %d\n", nclusters, size);

    // a 16-block cluster once allowed
    check_hist(dim3(32, 1), dim3(32), dim3(16, 1, 1));
    return finish();
}
