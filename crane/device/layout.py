"""The address-space layout every side of a session agrees on.

A session owns one VA window (invariant 2): the guest places its allocations in the bottom of
it, and the top :data:`MODULE_AREA` bytes hold module variables, which the worker places (a
module's variables exist before the guest knows their sizes). Windows are daemon slots: 1 TiB
each in [16 TiB, 64 TiB), below where Linux places PIE executables and their heaps (0x55..,
0x56..) and mmaps (0x7f..), so a guest process can reserve its window without colliding with
host memory. A slot is picked at random per session so that sessions of different daemons
rarely collide (a restore or migration needs its window free on the target).

Device memory is committed in :data:`CHUNK_GRANULARITY` pieces, the mapping granularity the CUDA
VMM API reports for current GPUs; every backend maps exactly such chunks.
"""

from __future__ import annotations

__all__ = [
    "CHUNK_GRANULARITY",
    "GUEST_SPAN",
    "MODULE_AREA",
    "WINDOW_BASE",
    "WINDOW_SIZE",
    "WINDOW_SLOTS",
    "module_area_base",
    "window_base",
]

#: Mapping granularity of device memory (2 MiB).
CHUNK_GRANULARITY = 2 << 20

#: First session window.
WINDOW_BASE = 0x1000_0000_0000
#: Size of one session's window.
WINDOW_SIZE = 1 << 40
#: Window slots a daemon hands out.
WINDOW_SLOTS = 48

#: Top of each window reserved for module variables (placed by the worker, not the guest).
MODULE_AREA = 64 << 30
#: What the guest may place allocations in: the window below the module area.
GUEST_SPAN = WINDOW_SIZE - MODULE_AREA


def window_base(slot: int) -> int:
    """Base address of window slot ``slot``."""
    return WINDOW_BASE + slot * WINDOW_SIZE


def module_area_base(window: tuple[int, int]) -> int:
    """Start of the module area of a window given as ``(base, size)``."""
    return window[0] + window[1] - MODULE_AREA
