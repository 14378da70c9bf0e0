"""Build the call ring's C core (:mod:`crane.wire._ringcore`), a cffi API-mode extension.

Run by setup.py's build hook (wheels, sdists) and scripts/setup.sh (an editable checkout):
``python crane/wire/ring_build.py`` compiles ``crane/wire/ringcore.c`` into
``crane/wire/_ringcore.*.so`` beside this file. The C does the waiting (spin, park, futex) so
that a call's round trip does not go through the interpreter's scheduler: cffi releases the
GIL around out-of-line calls.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

CDEF = """
uint64_t crane_ring_bytes(uint64_t cap);
uint64_t crane_ring_max_record(uint64_t cap);
int crane_ring_init(void *base, uint64_t cap);
uint64_t crane_ring_check(void *base, uint64_t total);
int crane_ring_write(void *base, uint64_t cap, int which, const void *buf, uint64_t len,
                     uint32_t flags, int timeout_ms, uint32_t spin);
int64_t crane_ring_wait(void *base, uint64_t cap, int which, int timeout_ms, uint32_t spin,
                        uint32_t *flags);
int crane_ring_take(void *base, uint64_t cap, int which, void *dst, uint64_t len);
int64_t crane_ring_recv(void *base, uint64_t cap, int which, int timeout_ms, uint32_t spin,
                        uint32_t *flags, void *dst, uint64_t room);
"""


def builder() -> FFI:
    ffi = FFI()
    ffi.cdef(CDEF)
    ffi.set_source(
        "crane.wire._ringcore",
        (HERE / "ringcore.c").read_text(),
        extra_compile_args=["-O2", "-std=gnu11"],
        # the stable ABI: one build serves every CPython 3 interpreter, so an application's
        # own (a torch venv's 3.12, say) loads it as well as the one that built it
        py_limited_api=True,
    )
    return ffi


def build(dest: Path = HERE) -> Path:
    """Compile the extension and place it in ``dest`` (the package directory)."""
    with tempfile.TemporaryDirectory(prefix="crane-ring-") as tmp:
        out = Path(builder().compile(tmpdir=tmp, verbose=False))
        target = dest / out.name
        # replaced, not overwritten: a process that has the old one mapped keeps it intact
        part = target.with_name(target.name + ".part")
        shutil.copy2(out, part)
        os.replace(part, target)
    for stale in dest.glob("_ringcore.*.so"):  # an earlier build's other suffix would shadow it
        if stale != target:
            stale.unlink()
    return target


if __name__ == "__main__":
    print(build())
