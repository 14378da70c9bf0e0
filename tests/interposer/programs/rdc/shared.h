#pragma once
extern __device__ int hits;       // defined in state.cu
extern __device__ int bias;       // defined in state.cu
__device__ int poly(int x);       // defined in ops.cu
__device__ int offset_of(int x);  // defined in ops.cu, reads bias
// an inline function every file that uses it emits (weak linkage)
inline __device__ __noinline__ int twice(int x) { return 2 * x; }
