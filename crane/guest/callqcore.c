/* The guest's queue of packed calls (crane/guest/callq.py; the records are crane/wire/packed.py's).
 *
 * Why C: appending a memset's record from Python cost about as much as everything else the
 * call does (a lock, a struct pack, a bytearray append, four attribute updates); here it is one
 * call that takes the sequence number and writes the record under the queue's own mutex (cffi
 * releases the GIL around the call, so another thread may be in here at the same time). The
 * transport takes every sequence number from here, the plain calls' too, so packed and plain
 * calls stay numbered in the order they were made.
 *
 * Which ops, and each argument's width, come from the call table: the Python side registers a
 * layout per packed op whose arguments are all unsigned (crane_callq_layout); an op without one
 * is refused (-1) and goes the Python way. An argument too wide for its field is refused (-3)
 * rather than cut, as struct.pack refuses it. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define RECORD 64
#define ARGS_AT 16
#define MAX_OPS 256
#define MAX_FIELDS 5

struct callq {
    pthread_mutex_t mu;
    uint64_t seq;  /* the last sequence number handed out */
    uint64_t n;    /* records queued */
    uint64_t cap;  /* records the buffer holds */
    uint32_t attention; /* nonzero: every put is refused with -4 (the transport has news) */
    uint8_t width[MAX_OPS][MAX_FIELDS + 1]; /* per op: argument widths (4 or 8), 0-ended */
    char buf[];
};

uint64_t crane_callq_bytes(uint64_t cap) { return sizeof(struct callq) + cap * RECORD; }

int crane_callq_init(void *mem, uint64_t cap) {
    struct callq *q = mem;
    memset(q, 0, sizeof(struct callq));
    q->cap = cap;
    return pthread_mutex_init(&q->mu, NULL) ? -1 : 0;
}

void crane_callq_destroy(void *mem) { pthread_mutex_destroy(&((struct callq *)mem)->mu); }

/* Serve op ``op`` with ``n`` arguments of the given widths (4 or 8 bytes, unsigned). */
int crane_callq_layout(void *mem, uint32_t op, const uint8_t *widths, uint32_t n) {
    struct callq *q = mem;
    uint32_t total = 0;
    if (op >= MAX_OPS || n > MAX_FIELDS) return -1;
    for (uint32_t i = 0; i < n; i++) {
        if (widths[i] != 4 && widths[i] != 8) return -1;
        total += widths[i];
    }
    if (total > RECORD - ARGS_AT) return -1;
    memcpy(q->width[op], widths, n);
    q->width[op][n] = 0;
    return 0;
}

void crane_callq_attend(void *mem, uint32_t on) {
    struct callq *q = mem;
    __atomic_store_n(&q->attention, on, __ATOMIC_RELEASE);
}

/* Append one call of ``op`` (arguments a[0..]; the unused ones ignored): the records now queued
 * (1: the batch's first; >= cap: full, send it), or -1 (op not served here), -2 (full: nothing
 * appended), -3 (an argument does not fit its field), -4 (attention: go the Python way). */
int64_t crane_callq_put(void *mem, uint32_t op, uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3,
                        uint64_t a4) {
    struct callq *q = mem;
    if (op >= MAX_OPS || !q->width[op][0]) return -1;
    if (__atomic_load_n(&q->attention, __ATOMIC_ACQUIRE)) return -4;
    const uint64_t a[MAX_FIELDS] = {a0, a1, a2, a3, a4};
    const uint8_t *w = q->width[op];
    char rec[RECORD];
    memset(rec, 0, RECORD);
    uint32_t at = ARGS_AT;
    for (int i = 0; i < MAX_FIELDS && w[i]; i++) {
        if (w[i] == 4) {
            if (a[i] > 0xFFFFFFFFull) return -3;
            uint32_t v = (uint32_t)a[i];
            memcpy(rec + at, &v, 4); /* little-endian hosts only (x86-64, aarch64) */
        } else {
            memcpy(rec + at, &a[i], 8);
        }
        at += w[i];
    }
    memcpy(rec + 8, &op, 4);
    pthread_mutex_lock(&q->mu);
    if (q->n >= q->cap) {
        pthread_mutex_unlock(&q->mu);
        return -2;
    }
    uint64_t seq = ++q->seq;
    memcpy(rec, &seq, 8);
    memcpy(q->buf + q->n * RECORD, rec, RECORD);
    int64_t n = (int64_t)++q->n;
    pthread_mutex_unlock(&q->mu);
    return n;
}

/* A sequence number for a plain call (taken: the next record gets the one after it). */
uint64_t crane_callq_next_seq(void *mem) {
    struct callq *q = mem;
    pthread_mutex_lock(&q->mu);
    uint64_t seq = ++q->seq;
    pthread_mutex_unlock(&q->mu);
    return seq;
}

uint64_t crane_callq_count(void *mem) {
    struct callq *q = mem;
    pthread_mutex_lock(&q->mu);
    uint64_t n = q->n;
    pthread_mutex_unlock(&q->mu);
    return n;
}

/* Move up to ``room`` queued records (the oldest) into ``dst``; those left move to the front.
 * The records moved; *last: the last one's sequence number (untouched when none moved). */
uint64_t crane_callq_take(void *mem, void *dst, uint64_t room, uint64_t *last) {
    struct callq *q = mem;
    pthread_mutex_lock(&q->mu);
    uint64_t n = q->n < room ? q->n : room;
    if (n) {
        memcpy(dst, q->buf, n * RECORD);
        memcpy(last, q->buf + (n - 1) * RECORD, 8);
        memmove(q->buf, q->buf + n * RECORD, (q->n - n) * RECORD);
        q->n -= n;
    }
    pthread_mutex_unlock(&q->mu);
    return n;
}
