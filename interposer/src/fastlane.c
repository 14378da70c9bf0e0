/* The fast lane: small asynchronous calls queued as packed records by this library's C, without
 * entering Python (crane/interposer/fastlane.py is the other half).
 *
 * Why: through the Python side a one-byte cudaMemsetAsync cost the guest 7-8 us (the cffi
 * callback takes the GIL, then a handler, the session's checks and the queue's put), against
 * 0.2 us of worker time per call: the guest bounded the async call rate at ~130k/s. Here the
 * same call is a few comparisons and the queue's put (crane/guest/callqcore.c, through the
 * function pointer the Python side hands over, so the records and their sequence numbers come
 * from the one queue every other call takes its number from: order is kept).
 *
 * What may go this way is only what the Python side would accept without any other effect,
 * and it decides that, not this file: it *teaches* the lane after it served a call itself
 * (crane_fast_learn: a device range it checked, a stream it knows), and it *forgets* everything
 * whenever any of that may stop holding (a free or an unmap, a stream destroyed, a capture or
 * a mirror begun, a sticky fault: crane_fast_forget). A call that does not match what was
 * learnt, or that the queue refuses (full, a transport with news, an argument too wide), goes
 * the Python way as before, so every error is still found and worded there. A teaching that
 * raced a forgetting is dropped (the generation it was read under no longer matches).
 *
 * Threads: the tables are read and written under one mutex (uncontended it costs tens of
 * nanoseconds; the queue's put takes its own). Python calls in with the GIL released (cffi). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crane_cuda.h"
#include "../generated/impl.h"

#define RANGES 16
#define HANDLES 32

typedef int64_t (*put_fn)(void *, uint32_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int armed;       /* a queue and its put are known, and nothing was forgotten since */
static int disabled;    /* CRANE_FAST=0: never armed (the A/B switch; read once) */
static void *queue;     /* crane/guest/callqcore.c's struct callq, owned by the Python side */
static put_fn put;
static uint64_t cap;    /* the queue's capacity: a put answering it must be sent */
static uint32_t op_memset, op_event_record, op_stream_wait, op_copy;
static uint64_t gen;    /* bumped by every forget */
static uint64_t lo[RANGES], hi[RANGES];
static unsigned next_range;
struct handles { uint64_t h[HANDLES]; unsigned n; };
static struct handles streams, events;
static uint64_t calls;  /* calls queued here (crane_fast_calls) */

int crane_py_fast_queued(long long n);

static int is_off(void) {
    const char *v = getenv("CRANE_FAST");
    return v && (!strcmp(v, "0") || !strcmp(v, "off") || !strcmp(v, "no"));
}

/* Hand over the queue (its memory and its put) and the wire ops' ids; 1 when the lane may
 * now be used, 0 when CRANE_FAST=0 keeps it off. */
int crane_fast_arm(uint64_t q, uint64_t put_addr, uint64_t capacity, uint32_t memset_op,
                   uint32_t event_record_op, uint32_t stream_wait_op, uint32_t copy_op) {
    pthread_mutex_lock(&mu);
    static int checked;
    if (!checked) {
        disabled = is_off();
        checked = 1;
    }
    if (!disabled) {
        queue = (void *)(uintptr_t)q;
        put = (put_fn)(uintptr_t)put_addr;
        cap = capacity;
        op_memset = memset_op;
        op_event_record = event_record_op;
        op_stream_wait = stream_wait_op;
        op_copy = copy_op;
        armed = 1;
    }
    pthread_mutex_unlock(&mu);
    return !disabled;
}

uint64_t crane_fast_gen(void) {
    pthread_mutex_lock(&mu);
    uint64_t g = gen;
    pthread_mutex_unlock(&mu);
    return g;
}

/* Everything learnt may be stale: drop it and stay off until the next teaching. */
void crane_fast_forget(void) {
    pthread_mutex_lock(&mu);
    gen++;
    armed = 0;
    streams.n = events.n = 0;
    for (int i = 0; i < RANGES; i++) lo[i] = UINT64_MAX, hi[i] = 0;
    pthread_mutex_unlock(&mu);
}

static int has(const struct handles *t, uint64_t h) {
    for (unsigned i = 0; i < t->n; i++)
        if (t->h[i] == h) return 1;
    return 0;
}

static void add(struct handles *t, uint64_t h) {
    if (has(t, h)) return;
    if (t->n == HANDLES) t->n = 0; /* full: start over (rare) */
    t->h[t->n++] = h;
}

/* The Python side served a call on ``stream`` (a default one: nothing to learn) touching the
 * device range [start, end) (end 0: none) and the event ``event`` (0: none) under generation
 * ``g``: calls within them may come this way. */
void crane_fast_learn(uint64_t g, uint64_t start, uint64_t end, uint64_t stream,
                      uint64_t event) {
    pthread_mutex_lock(&mu);
    if (g == gen && queue) {
        armed = !disabled;
        if (end > start) {
            int known = 0;
            for (int i = 0; i < RANGES; i++) known |= lo[i] == start && hi[i] == end;
            if (!known) {
                lo[next_range] = start, hi[next_range] = end;
                next_range = (next_range + 1) % RANGES;
            }
        }
        if (stream > 2) add(&streams, stream);
        if (event) add(&events, event);
    }
    pthread_mutex_unlock(&mu);
}

uint64_t crane_fast_calls(void) { return __atomic_load_n(&calls, __ATOMIC_RELAXED); }

/* Whether [dst, dst+size) lies in a learnt range and ``stream`` is a default or learnt stream;
 * with ``mu`` held. */
static int known_locked(uint64_t dst, uint64_t size, uint64_t stream) {
    if (stream > 2 && !has(&streams, stream)) return 0;
    uint64_t end = dst + size;
    if (end < dst) return 0;
    for (int i = 0; i < RANGES; i++)
        if (lo[i] <= dst && end <= hi[i]) return 1;
    return 0;
}

/* After the queue took a record (it answered ``n`` records queued): the first of a batch arms
 * the transport's flush timer, a full queue is sent; both are the Python side's. */
static CUresult after_put(int64_t n) {
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    if (n == 1 || (uint64_t)n >= cap) return crane_py_fast_queued(n);
    return CUDA_SUCCESS;
}

/* The session's handle for the application's stream: NULL is the legacy stream, or the
 * per-thread one inside a _ptds entry (as crane/interposer/runtime.py maps it). */
static uint64_t stream_of(void *hstream) {
    uint64_t stream = (uint64_t)(uintptr_t)hstream;
    if (!stream && crane_in_ptds()) stream = (uint64_t)(uintptr_t)CRANE_STREAM_PER_THREAD;
    return stream;
}

/* Queue one record of ``op`` when ``ok`` (judged with ``mu`` held, which this releases):
 * CUDA_SUCCESS when queued here, -1 to go the Python way. */
static int put_unlock(int ok, uint32_t op, uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3,
                      uint64_t a4) {
    void *q = queue;
    put_fn f = put;
    pthread_mutex_unlock(&mu);
    if (!ok) return -1;
    int64_t n = f(q, op, a0, a1, a2, a3, a4);
    return n > 0 ? after_put(n) : -1;
}

/* cuMemsetD8/D16/D32 (and their Async forms): ``count`` elements of ``elem`` bytes of ``value``
 * at ``dst`` on ``stream`` (the application's handle: NULL is the legacy stream, or the
 * per-thread one inside a _ptds entry). */
int crane_fast_memset(uint64_t dst, uint64_t value, uint32_t elem, uint64_t count, void *hstream) {
    if (!__atomic_load_n(&armed, __ATOMIC_RELAXED) || !count) return -1;
    uint64_t stream = stream_of(hstream);
    uint64_t size = elem * count;
    if (size / elem != count) return -1;
    pthread_mutex_lock(&mu);
    int ok = armed && known_locked(dst, size, stream);
    return put_unlock(ok, op_memset, dst, value, elem, count, stream);
}

/* Whether ``stream`` (a default one or learnt) and ``event`` were learnt; with ``mu`` held. */
static int handles_known_locked(uint64_t stream, uint64_t event) {
    return armed && (stream <= 2 || has(&streams, stream)) && has(&events, event);
}

/* cuEventRecord(event, stream). */
int crane_fast_event_record(void *hevent, void *hstream) {
    if (!__atomic_load_n(&armed, __ATOMIC_RELAXED)) return -1;
    uint64_t e = (uint64_t)(uintptr_t)hevent, s = stream_of(hstream);
    pthread_mutex_lock(&mu);
    return put_unlock(handles_known_locked(s, e), op_event_record, e, s, 0, 0, 0);
}

/* cuEventRecordWithFlags(event, stream, flags): flags 0 is cuEventRecord; an external record
 * (CU_EVENT_RECORD_EXTERNAL: a graph's event-record node while capturing) is the Python
 * side's. */
int crane_fast_event_record_flags(void *hevent, void *hstream, unsigned flags) {
    return flags ? -1 : crane_fast_event_record(hevent, hstream);
}

/* cuStreamWaitEvent(stream, event, flags): only flags 0 (an external wait is the Python
 * side's: it may be a graph node). */
int crane_fast_stream_wait(void *hstream, void *hevent, unsigned flags) {
    if (!__atomic_load_n(&armed, __ATOMIC_RELAXED) || flags) return -1;
    uint64_t e = (uint64_t)(uintptr_t)hevent, s = stream_of(hstream);
    pthread_mutex_lock(&mu);
    return put_unlock(handles_known_locked(s, e), op_stream_wait, s, e, 0, 0, 0);
}

/* cuMemcpyDtoD(Async), cuMemcpy(Async): ``n`` bytes from ``src`` to ``dst``, each range
 * inside one learnt allocation (so the Python side would not split the copy either). */
int crane_fast_memcpy_dtod(uint64_t dst, uint64_t src, uint64_t n, void *hstream) {
    if (!__atomic_load_n(&armed, __ATOMIC_RELAXED) || !n) return -1;
    uint64_t stream = stream_of(hstream);
    pthread_mutex_lock(&mu);
    int ok = armed && known_locked(dst, n, stream) && known_locked(src, n, stream);
    return put_unlock(ok, op_copy, dst, src, n, stream, 0);
}
