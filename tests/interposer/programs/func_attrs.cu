// cudaFuncGetAttributes as CUB uses it: ptxVersion is the virtual architecture the kernel was
// compiled from (compute_XY), binaryVersion the architecture of the code the device runs.
#include <cstdio>
__global__ void probe(int* p) { if (p) *p = 1; }
int main() {
    cudaFuncAttributes a;
    cudaError_t e = cudaFuncGetAttributes(&a, probe);
    printf("%s ptx=%d binary=%d\n", cudaGetErrorString(e), a.ptxVersion, a.binaryVersion);
    return e != cudaSuccess;
}
