/* The simulated device's memsets, a run at a time (crane/backends/sim/memory.py, fill_run).
 *
 * A worker runs a batch's packed memsets as one run: NumPy validates every range at once,
 * and this loop applies them in call order (later calls overwrite earlier ones where they
 * overlap, as on a GPU stream), which a NumPy scatter does not promise. The caller has checked
 * every range against the allocations and the element sizes (1, 2, 4); nothing here reads
 * outside the ranges it is given. */
#include <stdint.h>
#include <string.h>

void crane_fill_run(char *base, const uint64_t *off, const uint32_t *value, const uint32_t *elem,
                    const uint64_t *count, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        char *d = base + off[i];
        uint64_t c = count[i];
        uint32_t v = value[i];
        if (elem[i] == 1) {
            memset(d, (int)(v & 0xFF), c);
        } else if (elem[i] == 2) {
            uint16_t w = (uint16_t)v;
            for (uint64_t k = 0; k < c; k++) memcpy(d + 2 * k, &w, 2);
        } else {
            for (uint64_t k = 0; k < c; k++) memcpy(d + 4 * k, &v, 4);
        }
    }
}
