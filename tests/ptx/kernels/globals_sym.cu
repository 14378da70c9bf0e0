// Module-scope __device__ variables addressed by name: nvcc emits `st.global.u32 [tot], %r`,
// `ld.global.v4.f32 {..}, [gs+16]` and the like (a uniform address with per-lane values).
struct S {
    int a;
    int b;
    long long c;
    float4 v;
};
__device__ int tot;
__device__ S gs;
__device__ unsigned int cnt;
__device__ float4 vec4;
__device__ int arr[8];

extern "C" __global__ void store_one(int n) {
    if (threadIdx.x == 0) tot = n;
}

// every lane stores to the same word: one writer wins
extern "C" __global__ void store_all(int n) { tot = n + (int)threadIdx.x; }

extern "C" __global__ void store_struct(int n) {
    if (threadIdx.x == 0) {
        gs.a = n;
        gs.b = n * 2;
        gs.c = (long long)n << 33;
        gs.v = make_float4(n, n + 1, n + 2, n + 3);
    }
}

extern "C" __global__ void load_struct(int* out) {
    int t = threadIdx.x;
    out[t * 4 + 0] = gs.a + t;
    out[t * 4 + 1] = gs.b;
    out[t * 4 + 2] = (int)(gs.c >> 33);
    out[t * 4 + 3] = (int)(gs.v.x + gs.v.y + gs.v.z + gs.v.w);
}

extern "C" __global__ void atomics(int n) {
    atomicAdd(&cnt, 1u);
    atomicMax(&tot, (int)threadIdx.x + n);
    atomicAdd(&arr[3], 2);
}

extern "C" __global__ void store_vec(float x) {
    vec4 = make_float4(x, x * 2, x * 3, (float)threadIdx.x);
}
