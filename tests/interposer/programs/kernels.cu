// Device code for the driver-API test, built to PTX and to a fatbin.
extern "C" __device__ int counter;
__device__ int counter;
extern "C" __global__ void scale(float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { x[i] *= a; atomicAdd(&counter, 1); }
}
