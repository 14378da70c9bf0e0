// Thrust and CUB as shipped with nvcc, each result checked against the host's own answer.
// CUB's kernels take kernel-parameter addresses, use warp/block collectives with member masks
// and pick code by the kernel's PTX version, so this program exercises all three.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <numeric>
#include <thrust/device_vector.h>
#include <thrust/host_vector.h>
#include <thrust/sort.h>
#include <thrust/reduce.h>
#include <thrust/scan.h>
#include <thrust/unique.h>
#include <thrust/copy.h>
#include <thrust/functional.h>
#include <cub/cub.cuh>

#include "check.h"

#define OK(cond, what)                                                                     \
    do {                                                                                   \
        CHECK(cond, "%s", what);                                                           \
        if (cond) printf("ok %s\n", what);                                                 \
    } while (0)

struct is_odd {
    __host__ __device__ bool operator()(int x) const { return x & 1; }
};

static unsigned next(unsigned &s) {
    s = s * 1664525u + 1013904223u;
    return s >> 8;
}

int main(int argc, char **argv) {
    const int n = argc > 1 ? atoi(argv[1]) : 5000;
    unsigned seed = 12345;
    std::vector<int> h(n);
    for (int i = 0; i < n; i++) h[i] = (int)(next(seed) % 2000) - 1000;

    // sort (radix sort of int keys), descending sort (merge sort with a comparator)
    thrust::device_vector<int> d(h.begin(), h.end());
    thrust::sort(d.begin(), d.end());
    std::vector<int> want(h);
    std::sort(want.begin(), want.end());
    thrust::host_vector<int> got = d;
    OK(std::equal(want.begin(), want.end(), got.begin()), "thrust::sort int");

    thrust::device_vector<float> f(n);
    std::vector<float> hf(n);
    for (int i = 0; i < n; i++) hf[i] = (float)h[i] * 0.25f;
    thrust::copy(hf.begin(), hf.end(), f.begin());
    thrust::sort(f.begin(), f.end(), thrust::greater<float>());
    std::sort(hf.begin(), hf.end(), std::greater<float>());
    thrust::host_vector<float> gf = f;
    OK(std::equal(hf.begin(), hf.end(), gf.begin()), "thrust::sort float greater");

    // sort_by_key
    thrust::device_vector<int> keys(h.begin(), h.end());
    thrust::device_vector<int> vals(n);
    thrust::sequence(vals.begin(), vals.end());
    thrust::stable_sort_by_key(keys.begin(), keys.end(), vals.begin());
    std::vector<int> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return h[a] < h[b]; });
    thrust::host_vector<int> gv = vals;
    OK(std::equal(idx.begin(), idx.end(), gv.begin()), "thrust::stable_sort_by_key");

    // reduce, inclusive/exclusive scan
    long long sum = thrust::reduce(d.begin(), d.end(), 0LL);
    OK(sum == std::accumulate(h.begin(), h.end(), 0LL), "thrust::reduce");
    int mx = thrust::reduce(d.begin(), d.end(), -1000000, thrust::maximum<int>());
    OK(mx == want[n - 1], "thrust::reduce maximum");
    thrust::device_vector<int> in(h.begin(), h.end()), sc(n);
    thrust::inclusive_scan(in.begin(), in.end(), sc.begin());
    std::vector<int> hs(n);
    std::partial_sum(h.begin(), h.end(), hs.begin());
    thrust::host_vector<int> gs = sc;
    OK(std::equal(hs.begin(), hs.end(), gs.begin()), "thrust::inclusive_scan");
    thrust::exclusive_scan(in.begin(), in.end(), sc.begin(), 7);
    gs = sc;
    bool ex_ok = gs[0] == 7;
    for (int i = 1; i < n && ex_ok; i++) ex_ok = gs[i] == hs[i - 1] + 7;
    OK(ex_ok, "thrust::exclusive_scan");

    // unique, copy_if
    auto end = thrust::unique(d.begin(), d.end());
    auto wend = std::unique(want.begin(), want.end());
    OK((end - d.begin()) == (wend - want.begin()), "thrust::unique count");
    thrust::device_vector<int> odd(n);
    auto oe = thrust::copy_if(in.begin(), in.end(), odd.begin(), is_odd());
    int nodd = (int)std::count_if(h.begin(), h.end(), [](int x) { return x & 1; });
    OK((oe - odd.begin()) == nodd, "thrust::copy_if count");
    thrust::host_vector<int> go(odd.begin(), oe);
    std::vector<int> wo;
    std::copy_if(h.begin(), h.end(), std::back_inserter(wo), [](int x) { return x & 1; });
    OK(std::equal(wo.begin(), wo.end(), go.begin()), "thrust::copy_if order");

    // cub::DeviceRadixSort::SortPairs on unsigned keys
    std::vector<unsigned> hk(n);
    for (int i = 0; i < n; i++) hk[i] = next(seed);
    unsigned *dk_in, *dk_out;
    int *dv_in, *dv_out;
    cudaMalloc(&dk_in, n * sizeof(unsigned));
    cudaMalloc(&dk_out, n * sizeof(unsigned));
    cudaMalloc(&dv_in, n * sizeof(int));
    cudaMalloc(&dv_out, n * sizeof(int));
    cudaMemcpy(dk_in, hk.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice);
    cudaMemcpy(dv_in, idx.data(), n * sizeof(int), cudaMemcpyHostToDevice);
    void *tmp = nullptr;
    size_t tmp_bytes = 0;
    cub::DeviceRadixSort::SortPairs(tmp, tmp_bytes, dk_in, dk_out, dv_in, dv_out, n);
    cudaMalloc(&tmp, tmp_bytes);
    cub::DeviceRadixSort::SortPairs(tmp, tmp_bytes, dk_in, dk_out, dv_in, dv_out, n);
    std::vector<unsigned> rk(n);
    cudaMemcpy(rk.data(), dk_out, n * sizeof(unsigned), cudaMemcpyDeviceToHost);
    std::vector<unsigned> wk(hk);
    std::sort(wk.begin(), wk.end());
    OK(rk == wk, "cub::DeviceRadixSort::SortPairs");
    cudaFree(tmp);

    // cub::DeviceSegmentedRadixSort over 7 segments of uneven length
    const int nseg = 7;
    std::vector<int> offs(nseg + 1);
    for (int s = 0; s <= nseg; s++) offs[s] = (int)((long long)n * s * s / (nseg * nseg));
    int *d_offs;
    cudaMalloc(&d_offs, (nseg + 1) * sizeof(int));
    cudaMemcpy(d_offs, offs.data(), (nseg + 1) * sizeof(int), cudaMemcpyHostToDevice);
    tmp = nullptr;
    tmp_bytes = 0;
    cub::DeviceSegmentedRadixSort::SortKeys(tmp, tmp_bytes, dk_in, dk_out, n, nseg, d_offs,
                                            d_offs + 1);
    cudaMalloc(&tmp, tmp_bytes);
    cub::DeviceSegmentedRadixSort::SortKeys(tmp, tmp_bytes, dk_in, dk_out, n, nseg, d_offs,
                                            d_offs + 1);
    cudaMemcpy(rk.data(), dk_out, n * sizeof(unsigned), cudaMemcpyDeviceToHost);
    wk = hk;
    for (int s = 0; s < nseg; s++) std::sort(wk.begin() + offs[s], wk.begin() + offs[s + 1]);
    OK(rk == wk, "cub::DeviceSegmentedRadixSort::SortKeys");
    cudaFree(tmp);

    // cub::DeviceSegmentedReduce::Sum
    int *d_sums;
    cudaMalloc(&d_sums, nseg * sizeof(int));
    tmp = nullptr;
    tmp_bytes = 0;
    cub::DeviceSegmentedReduce::Sum(tmp, tmp_bytes, dv_in, d_sums, nseg, d_offs, d_offs + 1);
    cudaMalloc(&tmp, tmp_bytes);
    cub::DeviceSegmentedReduce::Sum(tmp, tmp_bytes, dv_in, d_sums, nseg, d_offs, d_offs + 1);
    std::vector<int> rs(nseg);
    cudaMemcpy(rs.data(), d_sums, nseg * sizeof(int), cudaMemcpyDeviceToHost);
    bool seg_ok = true;
    for (int s = 0; s < nseg; s++) {
        long long w = 0;
        for (int i = offs[s]; i < offs[s + 1]; i++) w += idx[i];
        seg_ok = seg_ok && rs[s] == (int)w;
    }
    OK(seg_ok, "cub::DeviceSegmentedReduce::Sum");

    cudaError_t err = cudaDeviceSynchronize();
    OK(err == cudaSuccess, "no CUDA error");
    return finish();
}
