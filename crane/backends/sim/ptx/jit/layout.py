"""The launch context a compiled kernel reads: one array of 64-bit words, shared by the code
generator (:mod:`.lower`, which emits loads of these slots) and the runner (:mod:`.runner`,
which fills them), so the two cannot disagree about where a field lives.

Pointers are stored as integers. After the fixed slots come two words per global-memory access
site of the kernel: the ``[start, end)`` of the allocation that site touched last, so the bounds
check of a lane that hits the same allocation as the lane before is two compares.
"""

from __future__ import annotations

__all__ = [
    "ALLOC_ENDS",
    "ALLOC_STARTS",
    "ASSERT_CTAID",
    "ASSERT_FILE",
    "ASSERT_FUNC",
    "ASSERT_LINE",
    "ASSERT_MSG",
    "ASSERT_TID",
    "BLOCK_BEGIN",
    "BLOCK_END",
    "COOP",
    "COOP_RESUME",
    "COOP_START",
    "CTAID_SHIFTS",
    "FAULT_ADDR",
    "FAULT_BYTES",
    "FAULT_KIND",
    "FAULT_PC",
    "FAULT_SPACE",
    "FIXED",
    "GRID",
    "GRID_WS",
    "INVARIANT",
    "KIND_ASSERT",
    "KIND_ILLEGAL",
    "KIND_MISALIGNED",
    "KIND_PRINTF",
    "KIND_TIMEOUT",
    "KIND_TRAP",
    "KPARAMS",
    "KPARAM_SIZE",
    "LOCAL",
    "LOCAL_SIZE",
    "MAX_BLOCK_DIM",
    "MAX_SHARED",
    "MEM_BASE",
    "MEM_BUF",
    "NALLOC",
    "NTID",
    "PRINTF_FN",
    "RESUME",
    "SAVE",
    "SHARED",
    "SHARED_SIZE",
    "SPACE_GLOBAL",
    "SPACE_LOCAL",
    "SPACE_PARAM",
    "SPACE_PARAM_STORE",
    "SPACE_SHARED",
    "STOP",
    "SUSPENDED",
    "SYMVALS",
    "TID_SHIFTS",
    "unpack",
]

MEM_BUF = 0  # the session window's buffer (device address MEM_BASE is its byte 0)
MEM_BASE = 1
ALLOC_STARTS = 2  # sorted allocation starts (uint64 array)
ALLOC_ENDS = 3
NALLOC = 4
KPARAMS = 5  # the packed kernel parameters
SHARED = 6  # one block's shared memory
SHARED_SIZE = 7  # its size (the interpreter's per-block shared stride)
SYMVALS = 8  # per-launch symbol values (module variable addresses, shared offsets)
GRID = 9  # 9, 10, 11: %nctaid.x/y/z
NTID = 12  # 12, 13, 14: %ntid.x/y/z
BLOCK_BEGIN = 15  # linear block ids [BLOCK_BEGIN, BLOCK_END) run in this call
BLOCK_END = 16
SAVE = 17  # register save area across barriers: registers x threads words, register-major
RESUME = 18  # per-lane resume point (int32): 0 start, k after barrier k, -1 exited
STOP = 19  # set by the runner's watchdog when the launch's deadline passed
FAULT_PC = 20  # the faulting instruction's index in the kernel's instruction table
FAULT_ADDR = 21
FAULT_KIND = 22
FAULT_BYTES = 23
FAULT_SPACE = 24
LOCAL = 25  # every lane's local memory: threads x LOCAL_SIZE bytes (jit/local.py)
LOCAL_SIZE = 26  # one lane's local stride (the interpreter's)
KPARAM_SIZE = 27  # bytes of kernel parameters (the buffer less its 8 bytes of padding)
#: a failed ``assert`` (KIND_ASSERT): __assertfail's message, file, line and function, and
#: the lane's %tid and %ctaid packed (x | y << 21 | z << 42; x | y << 32 | z << 48)
ASSERT_MSG, ASSERT_FILE, ASSERT_LINE, ASSERT_FUNC, ASSERT_TID, ASSERT_CTAID = range(28, 34)
#: bit offsets of x, y, z in a packed %tid and %ctaid word (ASSERT_TID, ASSERT_CTAID and the
#: ``vprintf`` call's arguments): %tid up to 2**21 a dimension, %ctaid.x 32 bits, y and z 16
TID_SHIFTS = (0, 21, 42)
CTAID_SHIFTS = (0, 32, 48)


def unpack(word: int, shifts: tuple[int, int, int]) -> tuple[int, int, int]:
    """The (x, y, z) a packed coordinate word holds (``word`` taken as unsigned)."""
    word &= 2**64 - 1
    _, y, z = shifts  # (x starts at bit 0)
    return word & ((1 << y) - 1), (word >> y) & ((1 << (z - y)) - 1), word >> z


PRINTF_FN = 34  # the address a compiled ``vprintf`` calls (:mod:`.printing`)
#: a cooperative launch's grid-sync workspace (what ``%envreg1:%envreg2`` read; 0 otherwise)
GRID_WS = 35
#: 0: an ordinary call (blocks [BLOCK_BEGIN, BLOCK_END) run to their end); in a cooperative
#: launch (:mod:`.coop`) one block a call, COOP_START to start it, COOP_RESUME to go on from
#: where it suspended (its buffers untouched), and the driver returns SUSPENDED when the
#: block only waits on others
COOP = 36
COOP_START, COOP_RESUME = 1, 2
#: a driver's answer: the block waits at a yield point on other blocks (cooperative only)
SUSPENDED = 2
FIXED = 37  # first per-site cache slot

#: bounds the compiled code may assume (``!range`` metadata): every block dimension at most
#: MAX_BLOCK_DIM, every shared offset (the block's shared size) below MAX_SHARED; launches
#: beyond them (possible only without a device profile's limits) run interpreted
MAX_BLOCK_DIM = 1 << 20
MAX_SHARED = 1 << 30

KIND_ILLEGAL, KIND_MISALIGNED, KIND_TIMEOUT, KIND_TRAP, KIND_ASSERT, KIND_PRINTF = range(1, 7)
SPACE_GLOBAL, SPACE_SHARED, SPACE_LOCAL, SPACE_PARAM, SPACE_PARAM_STORE = 0, 1, 2, 3, 4

#: context words that stay the same for a whole call: the driver loads them once and passes
#: them to the lane's code as arguments (so no store in the kernel can make them reload)
INVARIANT = (
    MEM_BUF,
    MEM_BASE,
    SHARED_SIZE,
    SYMVALS,
    KPARAMS,
    NTID,
    NTID + 1,
    NTID + 2,
    GRID,
    GRID + 1,
    GRID + 2,
    LOCAL,
    LOCAL_SIZE,
)
