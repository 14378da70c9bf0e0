// The library side of link_api.cpp: the definitions kernel.cu references.
__device__ float gain = 0.5f;
__device__ float scale(float x) { return 3.0f * x; }
