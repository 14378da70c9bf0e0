/* The call ring's bulk area: two single-producer single-consumer byte FIFOs in one shared
 * mapping (a memfd of its own, handed over with the call ring's): host-to-device bytes (FIFO 0,
 * the guest produces) and device-to-host bytes (FIFO 1, the worker produces).
 *
 * A bulk copy's call travels in the call ring without its bytes; the bytes stream through the
 * FIFO in the calls' order, both sides copying at once: the producer copies step i while the
 * consumer copies step i-1, each with one memcpy, with the GIL released. Positions only grow;
 * the producer stores head with release ordering after the bytes are written, the consumer
 * loads it with acquire, and the same holds for tail and the space it frees. A waiter first
 * spins (yielding the CPU: on two cores the peer may need this one) for a bounded time, since
 * the peer is in the middle of a copy and a futex round trip costs more than the wait, then
 * parks on a futex word with the lost-wake-up protocol of ringcore.c (set PARKED, fence,
 * re-check, sleep; the other side fences after publishing and rings only when PARKED is set).
 *
 * The mapping is shared with a peer that may be hostile or broken: positions read from it are
 * checked (head - tail never exceeds the capacity this process verified at mapping time), and
 * what does not add up is -EPROTO, never an access outside the data area. Either side may
 * close the area (the CLOSED word): every wait then ends; bytes already published can still
 * be read.
 */
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>

#include "shm_futex.h"
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define BULK_MAGIC 0x314b4c5542455243ULL /* "CREBULK1" */
/* The FIFOs' data start 2 KiB + 64 past a page boundary: device memory and most buffers are
 * page-aligned, and a memcpy whose source and destination share their offset within a page
 * runs at 60% of its speed on x86 (loads falsely wait on the stores of "4K aliasing"). */
#define BULK_HDR (4096 + 2048 + 64)
/* Bytes copied between two publications: small enough that the peer starts early (the
 * pipeline fills in one step), large enough that publishing costs nothing. */
#define STEP (256u << 10)
/* How long a waiter spins (yielding) before it parks, nanoseconds. */
#define SPIN_NS 200000ull

struct fifo {
    uint64_t head;
    char pad0[56];
    uint64_t tail;
    char pad1[56];
    uint32_t cons_parked, cons_bell;
    char pad2[56];
    uint32_t prod_parked, prod_bell;
    char pad3[56];
};

struct bulk_ctl {
    uint64_t magic, cap;
    uint32_t closed;
    char pad[44];
    struct fifo f[2];
};

/* Reads of at least this many bytes store into their destination with non-temporal stores:
 * the destination (device memory's mapping, the application's buffer) is not read again
 * soon, and a plain store first reads every line it writes, a third of the memory traffic
 * a copy between two processes makes (the FIFO's own lines stay in the cache). */
static uint64_t stream_min = 512u << 10;

/* Set the size from which reads stream (tests, measurements); returns the previous one. */
uint64_t crane_bulk_stream_min(uint64_t n) {
    uint64_t old = stream_min;
    stream_min = n;
    return old;
}

/* memcpy whose stores bypass the cache (x86-64; elsewhere memcpy). The caller fences
 * (sfence) before it publishes anything that orders after these stores. */
static void copy_stream(char *dst, const char *src, uint64_t n) {
#if defined(__x86_64__)
    uint64_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    if (head > n) head = n;
    memcpy(dst, src, head);
    dst += head, src += head, n -= head;
    for (; n >= 64; n -= 64, dst += 64, src += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)src);
        __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(dst + 48), d);
    }
    memcpy(dst, src, n);
#else
    memcpy(dst, src, n);
#endif
}

static inline void stream_fence(void) {
#if defined(__x86_64__)
    _mm_sfence();
#endif
}

static inline int is_closed(struct bulk_ctl *c) {
    return __atomic_load_n(&c->closed, __ATOMIC_ACQUIRE) != 0;
}

/* Bytes the producer may write now (0: none), or -EPROTO. */
static int64_t room(struct fifo *f, uint64_t cap) {
    uint64_t used = f->head - __atomic_load_n(&f->tail, __ATOMIC_ACQUIRE);
    if (used > cap) return -EPROTO;
    return (int64_t)(cap - used);
}

/* Bytes the consumer may read now, or -EPROTO. */
static int64_t avail(struct fifo *f, uint64_t cap) {
    uint64_t n = __atomic_load_n(&f->head, __ATOMIC_ACQUIRE) - f->tail;
    if (n > cap) return -EPROTO;
    return (int64_t)n;
}

typedef int64_t (*level_fn)(struct fifo *, uint64_t);

/* Wait until level() is non-zero: its value, 0 on timeout or when the area closed, -EPROTO. */
static int64_t wait_level(struct bulk_ctl *c, struct fifo *f, uint64_t cap, level_fn level,
                          uint32_t *parked, uint32_t *b, int timeout_ms) {
    int64_t n = level(f, cap);
    if (n) return n;
    uint64_t t0 = now_ns();
    uint64_t deadline = t0 + (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms) * 1000000ull;
    while (now_ns() - t0 < SPIN_NS) {
        if ((n = level(f, cap)) != 0) return n;
        if (is_closed(c)) return 0;
        sched_yield();
    }
    for (;;) {
        __atomic_store_n(parked, 1, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        uint32_t seen = __atomic_load_n(b, __ATOMIC_ACQUIRE);
        n = level(f, cap);
        if (n || is_closed(c)) {
            __atomic_store_n(parked, 0, __ATOMIC_RELAXED);
            return n;
        }
        uint64_t t = now_ns();
        if (t >= deadline) {
            __atomic_store_n(parked, 0, __ATOMIC_RELAXED);
            return 0;
        }
        futex_wait(b, seen, deadline - t);
        __atomic_store_n(parked, 0, __ATOMIC_RELAXED);
    }
}

uint64_t crane_bulk_bytes(uint64_t cap) { return BULK_HDR + 2 * cap; }

int crane_bulk_init(void *base, uint64_t cap) {
    if (cap < STEP || (cap & 4095)) return -EINVAL;
    struct bulk_ctl *c = base;
    memset(base, 0, BULK_HDR);
    c->cap = cap;
    __atomic_store_n(&c->magic, BULK_MAGIC, __ATOMIC_RELEASE);
    return 0;
}

/* The capacity of a mapping made by crane_bulk_init, or 0 if it is not one. */
uint64_t crane_bulk_check(void *base, uint64_t total) {
    struct bulk_ctl *c = base;
    if (total < BULK_HDR || __atomic_load_n(&c->magic, __ATOMIC_ACQUIRE) != BULK_MAGIC) return 0;
    uint64_t cap = c->cap;
    if (cap < STEP || (cap & 4095) || crane_bulk_bytes(cap) != total) return 0;
    return cap;
}

/* Close the area: every wait on either FIFO ends (published bytes stay readable). */
void crane_bulk_close(void *base) {
    struct bulk_ctl *c = base;
    __atomic_store_n(&c->closed, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 2; i++) {
        __atomic_add_fetch(&c->f[i].cons_bell, 1, __ATOMIC_SEQ_CST);
        futex_wake(&c->f[i].cons_bell, INT32_MAX);
        __atomic_add_fetch(&c->f[i].prod_bell, 1, __ATOMIC_SEQ_CST);
        futex_wake(&c->f[i].prod_bell, INT32_MAX);
    }
}

int crane_bulk_closed(void *base) { return is_closed((struct bulk_ctl *)base); }

/* Where FIFO ``which``'s data start in the mapping, and its producer's position: what a
 * producer reads back of bytes it wrote and the consumer has not taken. */
uint64_t crane_bulk_data_offset(uint64_t cap, int which) {
    return BULK_HDR + (uint64_t)(which & 1) * cap;
}

uint64_t crane_bulk_head(void *base, int which) {
    return __atomic_load_n(&((struct bulk_ctl *)base)->f[which & 1].head, __ATOMIC_ACQUIRE);
}

/* Write ``n`` bytes from ``src`` (NULL: zeros) into FIFO ``which`` of capacity ``cap`` (as
 * checked at mapping time). Returns the bytes written (0..n): fewer than ``n`` when the reader
 * made no room for ``timeout_ms`` (the caller looks whether its peer lives and goes on) or the
 * area closed; -EPROTO when the FIFO is corrupt. */
int64_t crane_bulk_put(void *base, uint64_t cap, int which, const void *src, uint64_t n,
                       int timeout_ms) {
    struct bulk_ctl *c = base;
    struct fifo *f = &c->f[which & 1];
    char *data = (char *)base + BULK_HDR + (uint64_t)(which & 1) * cap;
    uint64_t done = 0;
    while (done < n) {
        if (is_closed(c)) break;
        int64_t free_ = wait_level(c, f, cap, room, &f->prod_parked, &f->prod_bell, timeout_ms);
        if (free_ < 0) return free_;
        if (free_ == 0) break;
        uint64_t k = n - done;
        if (k > (uint64_t)free_) k = (uint64_t)free_;
        if (k > STEP) k = STEP;
        uint64_t head = f->head, at = head % cap, first = cap - at;
        if (first > k) first = k;
        if (src) {
            memcpy(data + at, (const char *)src + done, first);
            memcpy(data, (const char *)src + done + first, k - first);
        } else {
            memset(data + at, 0, first);
            memset(data, 0, k - first);
        }
        __atomic_store_n(&f->head, head + k, __ATOMIC_RELEASE);
        ring_bell(&f->cons_parked, &f->cons_bell, INT32_MAX);
        done += k;
    }
    return (int64_t)done;
}

/* Read ``n`` bytes of FIFO ``which`` into ``dst`` (NULL: discard them). Returns the bytes
 * read (0..n): fewer when the writer published nothing for ``timeout_ms``, or the area closed
 * and nothing is left; -EPROTO when the FIFO is corrupt. */
int64_t crane_bulk_get(void *base, uint64_t cap, int which, void *dst, uint64_t n,
                       int timeout_ms) {
    struct bulk_ctl *c = base;
    struct fifo *f = &c->f[which & 1];
    const char *data = (const char *)base + BULK_HDR + (uint64_t)(which & 1) * cap;
    uint64_t done = 0;
    while (done < n) {
        int64_t have = wait_level(c, f, cap, avail, &f->cons_parked, &f->cons_bell, timeout_ms);
        if (have < 0) return have;
        if (have == 0) break;
        uint64_t k = n - done;
        if (k > (uint64_t)have) k = (uint64_t)have;
        if (k > STEP) k = STEP;
        uint64_t tail = f->tail, at = tail % cap, first = cap - at;
        if (first > k) first = k;
        if (dst && n >= stream_min) {
            copy_stream((char *)dst + done, data + at, first);
            copy_stream((char *)dst + done + first, data, k - first);
        } else if (dst) {
            memcpy((char *)dst + done, data + at, first);
            memcpy((char *)dst + done + first, data, k - first);
        }
        __atomic_store_n(&f->tail, tail + k, __ATOMIC_RELEASE);
        ring_bell(&f->prod_parked, &f->prod_bell, INT32_MAX);
        done += k;
    }
    if (dst && n >= stream_min) stream_fence();
    return (int64_t)done;
}
