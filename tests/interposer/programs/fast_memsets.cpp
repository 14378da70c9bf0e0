// Memsets of every width, sync and async, on every kind of stream and from two threads, mixed
// with what must not take a shortcut: a range past an allocation's end, a freed allocation, a
// destroyed stream, a capturing stream, a mapped host block. Under Crane the library's C queues
// most of these memsets itself (interposer/src/fastlane.c); every answer and every byte must be
// what the Python side gives (CRANE_FAST=0) and what a GPU gives. The last line says whether
// the C side took the loops' calls (crane_fast_calls, a symbol only Crane's library has).
#include <cstdio>
#include <cstring>
#include <dlfcn.h>
#include <pthread.h>
#include <cuda.h>
#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *n_; cuGetErrorName(r_, &n_); printf("FAIL %s: %s\n", #x, n_); return 1; } } while (0)

static const char *name(CUresult r) { const char *n; cuGetErrorName(r, &n); return n; }

static unsigned long long fast_calls(void) {
    typedef unsigned long long (*fn)(void);
    fn f = (fn)dlsym(RTLD_DEFAULT, "crane_fast_calls");
    return f ? f() : 0;
}

static unsigned sum(const unsigned char *p, size_t n) {
    unsigned s = 2166136261u;  // FNV-1a: order matters, so a misplaced byte shows
    for (size_t i = 0; i < n; i++) s = (s ^ p[i]) * 16777619u;
    return s;
}

enum { N = 4096, LOOP = 3000 };
static CUcontext ctx;

struct worker { CUdeviceptr d; CUstream s; int seed; CUresult r; };

static void *thread_main(void *arg) {
    worker *w = (worker *)arg;
    w->r = cuCtxSetCurrent(ctx);
    for (int i = 0; i < LOOP && w->r == CUDA_SUCCESS; i++)
        w->r = cuMemsetD8Async(w->d + (i * 7) % (N - 8), (unsigned char)(w->seed + i), 1 + i % 5, w->s);
    if (w->r == CUDA_SUCCESS) w->r = cuStreamSynchronize(w->s);
    return NULL;
}

int main() {
    CUdevice dev;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CUdeviceptr a, b;
    CK(cuMemAlloc(&a, N));
    CK(cuMemAlloc(&b, N));
    CUstream s;  // (blocking: ordered with the legacy stream the synchronous memsets use)
    CK(cuStreamCreate(&s, 0));
    CK(cuMemsetD8(a, 0, N));
    CK(cuMemsetD8(b, 0, N));

    // the same memsets on the host copy, in program order (every stream is synchronized
    // before the next stream is used, so the order is the program's)
    static unsigned char ha[N], hb[N], got[N];
    memset(ha, 0, N), memset(hb, 0, N);
    CUstream kinds[4] = {NULL, s, CU_STREAM_PER_THREAD, CU_STREAM_LEGACY};
    unsigned long long before = fast_calls();
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < LOOP; i++) {
            int off = (i * 13 + k) % (N - 64);
            switch (i % 4) {
            case 0:
                CK(cuMemsetD8Async(a + off, (unsigned char)i, 3, kinds[k]));
                memset(ha + off, (unsigned char)i, 3);
                break;
            case 1: {
                int o = off & ~1;
                unsigned short v = (unsigned short)(i * 257 + k);
                CK(cuMemsetD16Async(b + o, v, 4, kinds[k]));
                for (int j = 0; j < 4; j++) memcpy(hb + o + 2 * j, &v, 2);
                break;
            }
            case 2: {
                int o = off & ~3;
                unsigned v = 0x01020304u * (unsigned)(i + 1);
                CK(cuMemsetD32Async(a + o, v, 2, kinds[k]));
                for (int j = 0; j < 2; j++) memcpy(ha + o + 4 * j, &v, 4);
                break;
            }
            default:
                CK(cuMemsetD8(b + off, (unsigned char)(i >> 2), 5));
                memset(hb + off, (unsigned char)(i >> 2), 5);
            }
        }
        CK(cuCtxSynchronize());
    }
    unsigned long long looped = fast_calls() - before;
    CK(cuMemcpyDtoH(got, a, N));
    int same_a = !memcmp(got, ha, N);
    CK(cuMemcpyDtoH(got, b, N));
    int same_b = !memcmp(got, hb, N);
    printf("loops a=%d b=%d sum=%08x,%08x\n", same_a, same_b, sum(ha, N), sum(hb, N));

    // past the end of a known allocation, a freed one, a destroyed stream: refused as before
    CUresult past = cuMemsetD8Async(a + N - 4, 1, 8, s);
    CK(cuMemFree(b));
    CUresult freed = cuMemsetD8Async(b, 1, 1, s);
    CUresult freed32 = cuMemsetD32(b, 1, 1);
    CUstream gone;
    CK(cuStreamCreate(&gone, 0));
    CK(cuMemsetD8Async(a, 9, 1, gone));
    CK(cuStreamDestroy(gone));
    CUresult destroyed = cuMemsetD8Async(a, 9, 1, gone);
    CK(cuCtxSynchronize());
    printf("refused past=%s freed=%s freed32=%s destroyed=%s\n", name(past), name(freed),
           name(freed32), name(destroyed));

    // a capturing stream records its memsets instead of running them
    CK(cuMemsetD8Async(a, 0x11, 16, s));
    CK(cuStreamSynchronize(s));
    CK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CK(cuMemsetD8Async(a, 0x77, 16, s));
    CUgraph g;
    CK(cuStreamEndCapture(s, &g));
    unsigned char first[2];
    CK(cuMemcpyDtoH(first, a, 1));
    CUgraphExec ge;
    CK(cuGraphInstantiate(&ge, g, 0));
    CK(cuGraphLaunch(ge, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(first + 1, a, 1));
    printf("capture before=%02x after=%02x\n", first[0], first[1]);

    // two threads, each its own stream and buffer, at once
    worker w[2];
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        CK(cuMemAlloc(&w[i].d, N));
        CK(cuMemsetD8(w[i].d, 0, N));
        CK(cuStreamCreate(&w[i].s, CU_STREAM_NON_BLOCKING));
        w[i].seed = 40 * (i + 1);
    }
    CK(cuCtxSynchronize());
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, thread_main, &w[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++) {
        unsigned char want[N];
        memset(want, 0, N);
        for (int j = 0; j < LOOP; j++)
            memset(want + (j * 7) % (N - 8), (unsigned char)(w[i].seed + j), 1 + j % 5);
        CK(cuMemcpyDtoH(got, w[i].d, N));
        printf("thread%d %s same=%d\n", i, name(w[i].r), !memcmp(got, want, N));
    }

    // events recorded and waited on in a loop: a producer stream fills, a consumer stream
    // waits for it and copies; then a destroyed event is refused as before
    CUstream prod, cons;
    CK(cuStreamCreate(&prod, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&cons, CU_STREAM_NON_BLOCKING));
    CUevent ev[2];
    CK(cuEventCreate(&ev[0], CU_EVENT_DISABLE_TIMING));
    CK(cuEventCreate(&ev[1], CU_EVENT_DISABLE_TIMING));
    CUdeviceptr c;
    CK(cuMemAlloc(&c, N));
    unsigned long long before_ev = fast_calls();
    for (int i = 0; i < 400; i++) {
        CK(cuMemsetD8Async(w[0].d, (unsigned char)i, N, prod));
        CK(cuEventRecord(ev[i & 1], prod));
        CK(cuStreamWaitEvent(cons, ev[i & 1], 0));
        CK(cuMemcpyDtoDAsync(c + (i % 8) * 8, w[0].d + i % 64, 8, cons));
        CK(cuEventRecordWithFlags(ev[i & 1], cons, 0));  // (flags 0: a plain record)
        CK(cuStreamWaitEvent(prod, ev[i & 1], 0));
    }
    CK(cuCtxSynchronize());
    unsigned long long evented = fast_calls() - before_ev;
    CK(cuMemcpyDtoH(got, c, 64));
    int ev_ok = 1;
    for (int k = 0; k < 8; k++)  // slot k last written at the last i with i % 8 == k
        for (int j = 0; j < 8; j++) ev_ok &= got[k * 8 + j] == (unsigned char)(392 + k);
    CK(cuEventDestroy(ev[1]));
    CUresult rec_gone = cuEventRecord(ev[1], prod);
    CUresult wait_gone = cuStreamWaitEvent(cons, ev[1], 0);
    CUresult wait_flags = cuStreamWaitEvent(cons, ev[0], 0x80);
    CUresult rec_flags = cuEventRecordWithFlags(ev[0], prod, 0x80);
    printf("events ok=%d record_gone=%s wait_gone=%s wait_flags=%s record_flags=%s\n", ev_ok,
           name(rec_gone), name(wait_gone), name(wait_flags), name(rec_flags));

    // device-to-device copies in a loop between two buffers, then past an end and from a
    // freed buffer (refused as before), and to page-locked host memory (done in the guest)
    CUdeviceptr e1, e2;
    CK(cuMemAlloc(&e1, N));
    CK(cuMemAlloc(&e2, N));
    CK(cuMemsetD8(e2, 0, N));
    for (int i = 0; i < N / 4; i++) CK(cuMemsetD32Async(e1 + 4 * i, 0x01000000u * (i & 0xff) + i, 1, s));
    unsigned long long before_copies = fast_calls();
    for (int i = 0; i < 300; i++)
        CK(cuMemcpyDtoDAsync(e2 + (i * 52) % (N - 64), e1 + (i * 36) % (N - 64), 64, i & 1 ? s : NULL));
    CK(cuMemcpyDtoD(e2 + N - 64, e1, 64));
    for (int i = 0; i < 200; i++)  // unified copies between the same two buffers
        CK(cuMemcpyAsync(e2 + 64 + (i * 20) % 512, e1 + (i * 44) % 1024, 32, s));
    CK(cuMemcpy(e2 + 2048, e1 + 8, 24));
    CK(cuCtxSynchronize());
    unsigned long long copied = fast_calls() - before_copies;
    unsigned char he1[N], he2[N];
    CK(cuMemcpyDtoH(he1, e1, N));
    CK(cuMemcpyDtoH(got, e2, N));
    memset(he2, 0, N);
    for (int i = 0; i < 300; i++) memcpy(he2 + (i * 52) % (N - 64), he1 + (i * 36) % (N - 64), 64);
    memcpy(he2 + N - 64, he1, 64);
    for (int i = 0; i < 200; i++) memcpy(he2 + 64 + (i * 20) % 512, he1 + (i * 44) % 1024, 32);
    memcpy(he2 + 2048, he1 + 8, 24);
    int copies_ok = !memcmp(got, he2, N);
    CUresult copy_past = cuMemcpyDtoDAsync(e2 + N - 8, e1, 16, s);
    CK(cuMemFree(e1));
    CUresult copy_freed = cuMemcpyDtoDAsync(e2, e1, 16, s);
    void *pinned;
    CK(cuMemAllocHost(&pinned, 64));
    CK(cuMemcpyDtoDAsync((CUdeviceptr)pinned, e2, 64, s));  // unified addressing: host memory
    CK(cuStreamSynchronize(s));
    int pinned_ok = !memcmp(pinned, got, 64);
    memset(pinned, 0x42, 64);
    CK(cuMemcpyAsync(e2 + 128, (CUdeviceptr)pinned, 64, s));  // a unified copy from the host
    CK(cuMemcpy((CUdeviceptr)got, e2 + 120, 16));  // and one to pageable host memory
    pinned_ok &= !memcmp(got, he2 + 120, 8) && got[8] == 0x42 && got[15] == 0x42;
    CK(cuMemFreeHost(pinned));
    printf("copies ok=%d past=%s freed=%s pinned=%d\n", copies_ok, name(copy_past),
           name(copy_freed), pinned_ok);

    // a mapped host block: memsets of any memory then owe it a push, the Python side's job
    void *host;
    CK(cuMemHostAlloc(&host, N, CU_MEMHOSTALLOC_DEVICEMAP));
    CUdeviceptr hd;
    CK(cuMemHostGetDevicePointer(&hd, host, 0));
    CK(cuMemsetD8Async(a, 0x5a, N, s));
    CK(cuMemsetD8Async(hd, 0x3c, N, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(got, a, N));
    printf("mapped host=%02x dev=%02x\n", ((unsigned char *)host)[N - 1], got[N - 1]);
    CK(cuMemFreeHost(host));
    CK(cuCtxDestroy(ctx));
    fprintf(stderr, "calls queued by the fast lane: loops %llu, events %llu, copies %llu\n",
            looped, evented, copied);
    printf("fast %s\n",
           looped >= 4 * LOOP / 2 && evented >= 6 * 400 - 12 && copied >= 490 ? "yes" : "no");
    return 0;
}
