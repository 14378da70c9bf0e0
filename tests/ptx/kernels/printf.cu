#include <cstdio>
// Device printf with the common conversions.
extern "C" __global__ void hello(int a, float b, const char* label) {
    printf("thread %d block %d: a=%d b=%f\n", threadIdx.x, blockIdx.x, a, b);
    if (threadIdx.x == 0) {
        printf("[%5d|%-5d|%05d|%+d|%x|%X|%#x|%o|%c|%u]\n", a, a, a, a, 255, 255, 255, 8, 'Z', -1);
        printf("%.3f %e %.2e %g %g %10.4f|%-8.2f|\n", b, b, 12345.678, 0.0001, 1e20, b, b);
        printf("%s and %s %ld %lld %lu %llu %i\n", "literal", label, -5L, -6LL, 7UL, 8ULL, -9);
        printf("%%done %5.1s|%-4s|\n", "xyz", "ab");
        printf("%p %.0f %G %E\n", (void*)0x1234, 2.5, 1e-10, 3.0);
        printf("no args\n");
    }
}
