__device__ int hits = 0;
__device__ int bias = 7;
