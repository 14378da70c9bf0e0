// Device-side calls under crane run: objects created with new in one launch and used through
// virtual functions in the next (heap blocks and vtables outlive launches), a function-pointer
// table, recursion, a malloc larger than the default 8 MiB heap (NULL), and delete.
#include <cstdio>

struct Op {
    int k;
    __device__ Op(int k) : k(k) {}
    __device__ virtual int apply(int x) const = 0;
    __device__ virtual ~Op() {}
};
struct AddK : Op {
    __device__ AddK(int k) : Op(k) {}
    __device__ int apply(int x) const override { return x + k; }
};
struct MulK : Op {
    __device__ MulK(int k) : Op(k) {}
    __device__ int apply(int x) const override { return x * k; }
};

__device__ Op* objects[64];

__global__ void make_objects() {
    int i = threadIdx.x;
    objects[i] = (i % 3 == 0) ? (Op*)new MulK(i) : (Op*)new AddK(i);
}

__global__ void use_objects(int* out) {
    int i = threadIdx.x;
    out[i] = objects[i] ? objects[i]->apply(10) : -1;
}

__global__ void delete_objects() { delete objects[threadIdx.x]; }

typedef int (*unary)(int);
__device__ __noinline__ int sq(int x) { return x * x; }
__device__ __noinline__ int neg(int x) { return -x; }
__device__ unary table[2] = {sq, neg};

__device__ __noinline__ int fact(int n) { return n <= 1 ? 1 : n * fact(n - 1); }

__global__ void misc(int* out, unsigned long long* big) {
    int i = threadIdx.x;
    out[i] = table[i & 1](i) + fact(i % 8);
    if (i == 0) {
        void* p = malloc(16ull << 20);
        *big = (unsigned long long)p;
        free(p);
    }
}

int main() {
    int *d, h[64];
    unsigned long long* dbig;
    unsigned long long big = 1;
    cudaMalloc(&d, sizeof h);
    cudaMalloc(&dbig, sizeof big);
    size_t heap = 0;
    cudaDeviceGetLimit(&heap, cudaLimitMallocHeapSize);
    make_objects<<<1, 64>>>();
    use_objects<<<1, 64>>>(d);
    cudaError_t e = cudaDeviceSynchronize();
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    bool ok = true;
    for (int i = 0; i < 64; ++i) ok &= h[i] == ((i % 3 == 0) ? 10 * i : 10 + i);
    printf("virtual sync=%s ok=%d h[3]=%d h[4]=%d heap=%zu\n", cudaGetErrorString(e), ok, h[3],
           h[4], heap);
    delete_objects<<<1, 64>>>();
    misc<<<1, 64>>>(d, dbig);
    e = cudaDeviceSynchronize();
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    cudaMemcpy(&big, dbig, sizeof big, cudaMemcpyDeviceToHost);
    int facts[8] = {1, 1, 2, 6, 24, 120, 720, 5040};
    ok = true;
    for (int i = 0; i < 64; ++i) ok &= h[i] == ((i & 1) ? -i : i * i) + facts[i % 8];
    printf("calls sync=%s ok=%d h[5]=%d big=%llu\n", cudaGetErrorString(e), ok, h[5], big);
    return 0;
}
