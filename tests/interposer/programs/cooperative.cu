// Cooperative launches through the interposer: a kernel that syncs the whole grid
// (cooperative_groups this_grid().sync()) launched with cudaLaunchCooperativeKernel and with
// cudaLaunchKernelEx + cudaLaunchAttributeCooperative, checked on the host; the grid the device
// cannot keep resident (occupancy x SMs + 1) refused at the call; and the same kernel launched
// normally, where grid.sync() has no workspace and the launch fails at the next sync.
#include <cooperative_groups.h>
#include <cstdio>
#include <cuda_runtime.h>
namespace cg = cooperative_groups;

__global__ void two_phase(int *a, int *out, int n) {
    cg::grid_group g = cg::this_grid();
    unsigned i = g.thread_rank();
    if (i < n) a[i] = i * 3 + 1;
    g.sync();
    if (i < n) out[i] = a[n - 1 - i] + a[(i + blockDim.x) % n];
}

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("FAIL %s: %s\n", #x, cudaGetErrorName(e_)); return 1; } } while (0)

static int check(const int *h, int n, int bs) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int want = ((n - 1 - i) * 3 + 1) + (((i + bs) % n) * 3 + 1);
        if (h[i] != want) bad++;
    }
    return bad;
}

int main() {
    int dev = 0, coop = 0, sms = 0, per_sm = 0;
    CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int bs = 256;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, two_phase, bs, 0));
    printf("attr coop=%d max_blocks=%d\n", coop, per_sm * sms);

    const int blocks = 24, n = blocks * bs - 7;
    int *a, *out, *h = new int[n];
    CK(cudaMalloc(&a, n * sizeof(int)));
    CK(cudaMalloc(&out, n * sizeof(int)));
    int nn = n;
    void *args[] = {&a, &out, &nn};
    CK(cudaMemset(out, 0, n * sizeof(int)));
    cudaError_t launch = cudaLaunchCooperativeKernel((void *)two_phase, blocks, bs, args, 0, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, out, n * sizeof(int), cudaMemcpyDeviceToHost));
    printf("coop launch=%s bad=%d out[0]=%d\n", cudaGetErrorName(launch), check(h, n, bs), h[0]);

    // cudaLaunchKernelEx with the cooperative attribute
    CK(cudaMemset(out, 0, n * sizeof(int)));
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(bs);
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    launch = cudaLaunchKernelEx(&cfg, two_phase, a, out, nn);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, out, n * sizeof(int), cudaMemcpyDeviceToHost));
    printf("ex launch=%s bad=%d\n", cudaGetErrorName(launch), check(h, n, bs));

    // exactly as many blocks as the device keeps resident: runs
    {
        const int full = per_sm * sms, fn = full * bs;
        int *fa, *fo, *fh = new int[fn];
        CK(cudaMalloc(&fa, fn * sizeof(int)));
        CK(cudaMalloc(&fo, fn * sizeof(int)));
        int fnn = fn;
        void *fargs[] = {&fa, &fo, &fnn};
        launch = cudaLaunchCooperativeKernel((void *)two_phase, full, bs, fargs, 0, 0);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(fh, fo, fn * sizeof(int), cudaMemcpyDeviceToHost));
        printf("full launch=%s bad=%d\n", cudaGetErrorName(launch), check(fh, fn, bs));
        delete[] fh;
    }

    // one block more than the device keeps resident: refused at the call, not sticky
    launch = cudaLaunchCooperativeKernel((void *)two_phase, per_sm * sms + 1, bs, args, 0, 0);
    cudaError_t last = cudaGetLastError();
    cudaError_t after = cudaDeviceSynchronize();
    printf("too_large launch=%s last=%s sync=%s\n", cudaGetErrorName(launch),
           cudaGetErrorName(last), cudaGetErrorName(after));

    // a normal launch: no grid-sync workspace, the kernel traps (a sticky launch failure)
    two_phase<<<blocks, bs>>>(a, out, nn);
    cudaError_t peek = cudaPeekAtLastError();
    cudaError_t sync = cudaDeviceSynchronize();
    printf("normal launch=%s sync=%s\n", cudaGetErrorName(peek), cudaGetErrorName(sync));
    delete[] h;
    return 0;
}
