/* What the call ring (ringcore.c) and its bulk area (bulkcore.c) share: the monotonic clock,
 * shared (non-private) futexes on words of a mapping two processes hold, and the publishing
 * side of the lost-wake-up protocol both use.
 *
 * The protocol: a waiter sets its PARKED word, issues a full fence, re-checks its condition
 * and only then sleeps on the bell word; the other side, after publishing, fences and rings
 * the bell only when PARKED is set. Each side's fence orders its store before its load, so
 * at least one of them sees the other's store: a wake-up cannot be lost.
 */
#ifndef CRANE_SHM_FUTEX_H
#define CRANE_SHM_FUTEX_H

#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Sleep while *addr == val, at most ns nanoseconds (a spurious return is the caller's to
 * re-check). */
static void futex_wait(uint32_t *addr, uint32_t val, uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    syscall(SYS_futex, addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

/* Wake up to n sleepers on addr. */
static void futex_wake(uint32_t *addr, int n) {
    syscall(SYS_futex, addr, FUTEX_WAKE, n, NULL, NULL, 0);
}

/* The publisher's half of the protocol: after the data's release store, wake up to n
 * sleepers on bell if the peer said it parks. */
static inline void ring_bell(uint32_t *parked, uint32_t *bell, int n) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(parked, __ATOMIC_RELAXED)) {
        __atomic_add_fetch(bell, 1, __ATOMIC_SEQ_CST);
        futex_wake(bell, n);
    }
}

#endif
