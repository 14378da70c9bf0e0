// Struct, vector and by-value parameters of assorted sizes and alignments.
struct Params {
    char tag;
    int count;
    double scale;
    short small;
    float4 v4;
    int2 v2;
    unsigned long long big;
};

extern "C" __global__ void struct_params(Params p, float4 extra, char c, double* out) {
    out[0] = p.tag;
    out[1] = p.count;
    out[2] = p.scale;
    out[3] = p.small;
    out[4] = p.v4.x; out[5] = p.v4.y; out[6] = p.v4.z; out[7] = p.v4.w;
    out[8] = p.v2.x; out[9] = p.v2.y;
    out[10] = (double)p.big;
    out[11] = extra.x + extra.y * 2 + extra.z * 3 + extra.w * 4;
    out[12] = c;
}

// float4 / int4 vector loads and stores.
extern "C" __global__ void vec4_copy(const float4* in, float4* out, int2* idx, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float4 v = in[i];
        out[i] = make_float4(v.w, v.z * 2.0f, v.y + 1.0f, v.x);
        idx[i] = make_int2(i, -i);
    }
}

// A struct array in global memory.
struct Particle { float x, y, z; int id; };
extern "C" __global__ void particles(Particle* ps, int n, float dt) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        Particle p = ps[i];
        p.x += dt * p.id;
        p.y -= dt;
        p.z = p.x * p.y;
        p.id += 1;
        ps[i] = p;
    }
}

// A by-value parameter of 32000 bytes (CUDA 12.1+ allows 32764 bytes of parameters; the old
// limit was 4 KB): every thread reads its own slice of it.
struct Big { int v[8000]; };
extern "C" __global__ void big_params(Big b, int scale, long long* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < 8000) out[i] = (long long)b.v[i] * scale;
}
