// Indirect calls: a table of device function pointers, a pointer passed as a kernel argument's
// selector, and virtual functions (vtables in global memory built by a constructor on device).
typedef int (*binop)(int, int);
__device__ __noinline__ int add_op(int a, int b) { return a + b; }
__device__ __noinline__ int mul_op(int a, int b) { return a * b; }
__device__ __noinline__ int sub_op(int a, int b) { return a - b; }
__device__ binop table[3] = {add_op, mul_op, sub_op};

extern "C" __global__ void apply_table(const int* a, const int* b, const int* sel, int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = table[sel[i] % 3](a[i], b[i]);
}

struct Shape {
    __device__ virtual float area() const = 0;
    __device__ virtual int sides() const { return 0; }
    __device__ virtual ~Shape() {}
};
struct Square : Shape {
    float s;
    __device__ Square(float s) : s(s) {}
    __device__ float area() const override { return s * s; }
    __device__ int sides() const override { return 4; }
};
struct Circle : Shape {
    float r;
    __device__ Circle(float r) : r(r) {}
    __device__ float area() const override { return 3.0f * r * r; }
};

extern "C" __global__ void virtuals(const float* x, float* area, int* sides, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Square sq(x[i]);
    Circle c(x[i]);
    Shape* s = (i & 1) ? (Shape*)&c : (Shape*)&sq;
    area[i] = s->area();
    sides[i] = s->sides();
}
