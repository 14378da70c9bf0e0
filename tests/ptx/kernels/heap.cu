// Device malloc/free and new/delete: per-thread blocks that outlive the launch, freed by a
// later launch; a request larger than the heap gets NULL.
#include <cstdint>

struct Node {
    int value;
    Node* next;
    __device__ Node(int v, Node* n) : value(v), next(n) {}
};

extern "C" __global__ void alloc_blocks(int** slots, int n, int len) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int* p = (int*)malloc(len * sizeof(int));
    if (p) {
        for (int k = 0; k < len; ++k) p[k] = i * 1000 + k;
    }
    slots[i] = p;
}

extern "C" __global__ void sum_and_free(int** slots, int n, int len, long long* sums) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long s = -1;
    if (slots[i]) {
        s = 0;
        for (int k = 0; k < len; ++k) s += slots[i][k];
        free(slots[i]);
    }
    sums[i] = s;
}

extern "C" __global__ void too_big(unsigned long long bytes, uint64_t* out) {
    void* p = malloc(bytes);
    *out = (uint64_t)p;
    free(p);
}

extern "C" __global__ void linked_list(int n, int* out) {
    Node* head = nullptr;
    for (int k = 0; k < n; ++k) head = new Node(k * threadIdx.x, head);
    int s = 0;
    while (head) {
        Node* next = head->next;
        s += head->value;
        delete head;
        head = next;
    }
    out[threadIdx.x] = s;
}
