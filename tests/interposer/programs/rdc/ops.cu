#include <cstdio>
#include "shared.h"

static __device__ __noinline__ int local_tag() { return 1000; }  // a different static of the same name

__device__ int poly(int x) { return 3 * x * x + 1 + twice(0); }
__device__ int offset_of(int x) {
    if (x == 0) printf("ops: first call\n");
    return x + bias + local_tag();
}
