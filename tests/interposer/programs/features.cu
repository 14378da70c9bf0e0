// Wider runtime features through the interposer: constant memory and cudaMemcpyToSymbol,
// dynamic shared memory above 48 KiB, 2D copies, stream-ordered allocation, pinned host memory,
// pointer attributes, occupancy and function attributes. Each line prints computed values.
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>
__constant__ float coef[4];
__global__ void poly(const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = coef[0] + coef[1] * x[i] + coef[2] * x[i] * x[i] + coef[3];
}
__global__ void reverse_smem(int *p, int n) {
    extern __shared__ int s[];
    int t = threadIdx.x;
    s[t] = p[t];
    __syncthreads();
    p[t] = s[n - 1 - t];
}
__global__ void rows(float *m, size_t pitch, int w, int h) {
    int x = threadIdx.x, y = blockIdx.x;
    if (x < w && y < h) {
        float *row = (float *)((char *)m + y * pitch);
        row[x] = row[x] * 10 + y;
    }
}
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("FAIL %s: %s\n", #x, cudaGetErrorName(e_)); return 1; } } while (0)
__global__ void say(int tag) { printf("order device %d\n", tag); }
int main() {
    // device printf comes out in order with the host's (stdout is a pipe here: block-buffered)
    printf("order host\n");
    say<<<1, 1>>>(7);
    CK(cudaDeviceSynchronize());
    printf("order after\n");
    // constant memory
    float c[4] = {1, 2, 3, 0.5f}, hx[8], hy[8];
    for (int i = 0; i < 8; i++) hx[i] = i;
    float *dx, *dy;
    CK(cudaMalloc(&dx, sizeof hx)); CK(cudaMalloc(&dy, sizeof hy));
    CK(cudaMemcpyToSymbol(coef, c, sizeof c));
    CK(cudaMemcpy(dx, hx, sizeof hx, cudaMemcpyHostToDevice));
    poly<<<1, 8>>>(dx, dy, 8);
    CK(cudaMemcpy(hy, dy, sizeof hy, cudaMemcpyDeviceToHost));
    float back[4]; CK(cudaMemcpyFromSymbol(back, coef, sizeof back));
    printf("const y[0]=%.1f y[3]=%.1f back[3]=%.1f\n", hy[0], hy[3], back[3]);
    // dynamic shared memory above the default 48 KiB
    const int n = 256, smem = 64 * 1024;
    int hp[n], *dp;
    for (int i = 0; i < n; i++) hp[i] = i;
    CK(cudaMalloc(&dp, sizeof hp));
    CK(cudaMemcpy(dp, hp, sizeof hp, cudaMemcpyHostToDevice));
    reverse_smem<<<1, n, smem>>>(dp, n);
    cudaError_t before = cudaGetLastError();
    CK(cudaFuncSetAttribute(reverse_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    reverse_smem<<<1, n, smem>>>(dp, n);
    CK(cudaGetLastError());
    CK(cudaMemcpy(hp, dp, sizeof hp, cudaMemcpyDeviceToHost));
    printf("smem before_attr=%s p[0]=%d p[255]=%d\n", cudaGetErrorName(before), hp[0], hp[255]);
    // 2D copies
    const int w = 5, h = 3;
    float hm[h][w], out[h][w];
    for (int y = 0; y < h; y++) for (int x = 0; x < w; x++) hm[y][x] = y * w + x;
    float *dm; size_t pitch;
    CK(cudaMallocPitch(&dm, &pitch, w * sizeof(float), h));
    CK(cudaMemcpy2D(dm, pitch, hm, w * sizeof(float), w * sizeof(float), h, cudaMemcpyHostToDevice));
    rows<<<h, 32>>>(dm, pitch, w, h);
    CK(cudaMemcpy2D(out, w * sizeof(float), dm, pitch, w * sizeof(float), h, cudaMemcpyDeviceToHost));
    printf("2d pitch_ok=%d out[0][0]=%.0f out[1][2]=%.0f out[2][4]=%.0f\n", pitch >= w * sizeof(float), out[0][0], out[1][2], out[2][4]);
    // 2D memsets (cuMemsetD2D8, its async form): columns 0-1 of every row, then column 4 of
    // rows 0-1 to all ones; the rest as the kernel left it
    CK(cudaMemset2D(dm, pitch, 0, 2 * sizeof(float), h));
    CK(cudaMemset2DAsync((char *)dm + 4 * sizeof(float), pitch, 0xff, sizeof(float), 2, 0));
    CK(cudaMemcpy2D(out, w * sizeof(float), dm, pitch, w * sizeof(float), h, cudaMemcpyDeviceToHost));
    unsigned bits; memcpy(&bits, &out[1][4], sizeof bits);
    printf("memset2d out[0][0]=%.0f out[2][1]=%.0f out[1][2]=%.0f out[1][4]=%#x out[2][4]=%.0f\n",
           out[0][0], out[2][1], out[1][2], bits, out[2][4]);
    // peers: one device, no peer of itself; a peer copy between its own contexts is a copy
    int can = -1; CK(cudaDeviceCanAccessPeer(&can, 0, 0));
    cudaError_t enable = cudaDeviceEnablePeerAccess(0, 0);
    float peer[h][w]; float *dpeer; CK(cudaMalloc(&dpeer, sizeof peer));
    CK(cudaMemcpyPeer(dpeer, 0, dm, 0, w * sizeof(float)));
    CK(cudaMemcpyPeerAsync(dpeer + w, 0, (char *)dm + pitch, 0, w * sizeof(float), 0));
    CK(cudaMemcpy(peer, dpeer, 2 * w * sizeof(float), cudaMemcpyDeviceToHost));
    printf("peer can=%d enable=%s copy=%.0f,%.0f\n", can, cudaGetErrorName(enable), peer[0][2], peer[1][2]);
    // stream-ordered allocation
    cudaStream_t s; CK(cudaStreamCreate(&s));
    int *da; CK(cudaMallocAsync(&da, 1024, s));
    CK(cudaMemsetAsync(da, 0x01, 1024, s));
    int hv = 0; CK(cudaMemcpyAsync(&hv, da + 10, sizeof hv, cudaMemcpyDeviceToHost, s));
    CK(cudaFreeAsync(da, s));
    CK(cudaStreamSynchronize(s));
    printf("async alloc value=%#x\n", hv);
    // pinned host memory and pointer attributes
    float *pinned; CK(cudaMallocHost(&pinned, 64));
    pinned[0] = 42;
    CK(cudaMemcpy(dx, pinned, sizeof(float), cudaMemcpyHostToDevice));
    float got = 0; CK(cudaMemcpy(&got, dx, sizeof got, cudaMemcpyDeviceToHost));
    cudaPointerAttributes ad, ah, au;
    CK(cudaPointerGetAttributes(&ad, dx + 1));
    CK(cudaPointerGetAttributes(&ah, pinned));
    int local = 0;
    CK(cudaPointerGetAttributes(&au, &local));
    printf("attrs dev=%d host=%d unreg=%d devptr_ok=%d pinned_copy=%.0f\n", (int)ad.type, (int)ah.type, (int)au.type, ad.devicePointer == dx + 1, got);
    CK(cudaFreeHost(pinned));
    // occupancy and function attributes
    int blocks = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, poly, 256, 0));
    cudaFuncAttributes fa; CK(cudaFuncGetAttributes(&fa, reverse_smem));
    printf("occupancy blocks=%d maxthreads=%d maxdyn=%d\n", blocks, fa.maxThreadsPerBlock, fa.maxDynamicSharedSizeBytes);
    size_t fr, tot; CK(cudaMemGetInfo(&fr, &tot));
    printf("meminfo ok=%d\n", fr <= tot && tot > 0);
    CK(cudaFree(dx)); CK(cudaFree(dy)); CK(cudaFree(dp)); CK(cudaFree(dm));
    CK(cudaStreamDestroy(s));
    CK(cudaDeviceReset());
    printf("done\n");
    return 0;
}
