"""Build the call ring's bulk area core (:mod:`crane.wire._bulkcore`), a cffi API-mode
extension beside the ring's own (``ring_build.py``).

Run by setup.py's build hook and scripts/setup.sh: ``python crane/wire/bulk_build.py``
compiles ``crane/wire/bulkcore.c`` into ``crane/wire/_bulkcore.*.so``. A module of its own so
that the bulk copies' C evolves apart from the call ring's small-call path; cffi releases the
GIL around its calls, so both processes copy at once.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

CDEF = """
uint64_t crane_bulk_bytes(uint64_t cap);
int crane_bulk_init(void *base, uint64_t cap);
uint64_t crane_bulk_check(void *base, uint64_t total);
void crane_bulk_close(void *base);
int crane_bulk_closed(void *base);
uint64_t crane_bulk_stream_min(uint64_t n);
uint64_t crane_bulk_data_offset(uint64_t cap, int which);
uint64_t crane_bulk_head(void *base, int which);
int64_t crane_bulk_put(void *base, uint64_t cap, int which, const void *src, uint64_t n,
                       int timeout_ms);
int64_t crane_bulk_get(void *base, uint64_t cap, int which, void *dst, uint64_t n,
                       int timeout_ms);
"""


def builder() -> FFI:
    ffi = FFI()
    ffi.cdef(CDEF)
    ffi.set_source(
        "crane.wire._bulkcore",
        (HERE / "bulkcore.c").read_text(),
        extra_compile_args=["-O2", "-std=gnu11"],
        py_limited_api=True,  # as the ring's: any CPython 3 loads it
    )
    return ffi


def build(dest: Path = HERE) -> Path:
    """Compile the extension and place it in ``dest`` (the package directory)."""
    with tempfile.TemporaryDirectory(prefix="crane-bulk-") as tmp:
        out = Path(builder().compile(tmpdir=tmp, verbose=False))
        target = dest / out.name
        part = target.with_name(target.name + ".part")  # replaced, not overwritten
        shutil.copy2(out, part)
        os.replace(part, target)
    for stale in dest.glob("_bulkcore.*.so"):
        if stale != target:
            stale.unlink()
    return target


if __name__ == "__main__":
    print(build())
