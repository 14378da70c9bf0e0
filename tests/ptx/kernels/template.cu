// A templated kernel, explicitly instantiated for three element types.
template <typename T, int UNROLL>
__global__ void axpby(T a, const T* x, T b, T* y, int n) {
    int i0 = (blockIdx.x * blockDim.x + threadIdx.x) * UNROLL;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        int i = i0 + u;
        if (i < n) y[i] = a * x[i] + b * y[i];
    }
}
template __global__ void axpby<float, 4>(float, const float*, float, float*, int);
template __global__ void axpby<int, 2>(int, const int*, int, int*, int);
template __global__ void axpby<double, 1>(double, const double*, double, double*, int);
