// Data-dependent loops, early exit, break/continue, switch.
extern "C" __global__ void collatz(const unsigned* start, int* steps, int n, int cap) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned long long x = start[i];
    if (x == 0) { steps[i] = -1; return; }
    int s = 0;
    while (x != 1) {
        x = (x & 1) ? 3 * x + 1 : x >> 1;
        if (++s >= cap) { s = -2; break; }
    }
    steps[i] = s;
}

extern "C" __global__ void find_first(const int* data, int rowlen, int target, int* where, int rows) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    where[r] = -1;
    for (int j = 0; j < rowlen; ++j) {
        int v = data[r * rowlen + j];
        if (v < 0) continue;
        if (v == target) { where[r] = j; return; }
    }
}

extern "C" __global__ void switcher(const int* in, int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int v = in[i], r;
    switch (v & 7) {
        case 0: r = v * 3; break;
        case 1: r = v - 100; break;
        case 2: r = v ^ 0x5a5a; break;
        case 3: r = -v; break;
        case 4: r = v << 3; break;
        case 5: r = v / 7; break;
        case 6: r = v % 11; break;
        default: r = 42;
    }
    out[i] = r;
}
