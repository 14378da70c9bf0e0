// Integer intrinsics and 64-bit arithmetic.
extern "C" __global__ void intops32(const unsigned* a, const unsigned* b, unsigned* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned x = a[i], y = b[i];
    int sx = (int)x, sy = (int)y;
    unsigned* o = out + 24 * i;
    o[0] = __umulhi(x, y);
    o[1] = (unsigned)__mulhi(sx, sy);
    o[2] = __popc(x);
    o[3] = __clz(x);
    o[4] = __brev(x);
    o[5] = __byte_perm(x, y, 0x5140);
    o[6] = __byte_perm(x, y, y & 0x7777);
    o[7] = __ffs(sx);
    o[8] = (x >> (y & 31)) & 0x3ff;               // bfe
    o[9] = (x & ~(0xffu << 8)) | ((y & 0xff) << 8);  // bfi
    o[10] = __funnelshift_l(x, y, sx);
    o[11] = __funnelshift_r(x, y, sx);
    o[12] = sy != 0 ? (unsigned)(sx / sy) : 0u;
    o[13] = sy != 0 ? (unsigned)(sx % sy) : 0u;
    o[14] = y != 0 ? x / y : 0u;
    o[15] = y != 0 ? x % y : 0u;
    o[16] = (unsigned)max(sx, sy) ^ min(x, y);
    o[17] = (unsigned)abs(sx);
    o[18] = __sad(sx, sy, 7u);
    o[19] = (unsigned)(sx >> (y & 31)) + (x << (y & 15));
    o[20] = __byte_perm(x, 0, 0x0123);
    o[21] = (unsigned)(((signed char)(x & 0xff)) * (short)(y >> 16));
    o[22] = x * y + (x ^ y);
    o[23] = __dp4a(x, y, 5u);
}

extern "C" __global__ void intops64(const unsigned long long* a, const unsigned long long* b,
                                    unsigned long long* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned long long x = a[i], y = b[i];
    long long sx = (long long)x, sy = (long long)y;
    unsigned long long* o = out + 16 * i;
    o[0] = x * y;
    o[1] = __umul64hi(x, y);
    o[2] = (unsigned long long)__mul64hi(sx, sy);
    o[3] = y ? x / y : 0;
    o[4] = y ? x % y : 0;
    o[5] = sy ? (unsigned long long)(sx / sy) : 0;
    o[6] = sy ? (unsigned long long)(sx % sy) : 0;
    o[7] = __popcll(x) + 100 * __clzll(y);
    o[8] = __brevll(x);
    o[9] = x << (y & 63);
    o[10] = (unsigned long long)(sx >> (y & 63));
    o[11] = x + y + (x < y);
    o[12] = (unsigned long long)(unsigned)x * (unsigned)(y >> 32);   // mul.wide.u32
    o[13] = (unsigned long long)((long long)(int)x * (int)y);        // mul.wide.s32
    o[14] = __ffsll(sx);
    o[15] = (x >> 7) ^ (y << 9) ^ ~x;
}
