"""Build the shared-memory transport's C cores, cffi API-mode extensions beside this file:
:mod:`crane.wire._ringcore` (the call ring, ``ringcore.c``) and :mod:`crane.wire._bulkcore`
(its bulk area for large copies, ``bulkcore.c``), which share ``shm_futex.h``; and the one
C of the call path's two ends, built the same way: :mod:`crane.guest._callq` (the guest's
queue of packed calls, ``crane/guest/callqcore.c``) and :mod:`crane.backends.sim._fillcore`
(the simulated device's memsets a run at a time, ``crane/backends/sim/fillcore.c``).

Run by setup.py's build hook (wheels, sdists) and scripts/setup.sh (an editable checkout):
``python crane/wire/shm_build.py``. The C does the waiting (spin, park, futex) and the copying
so that neither goes through the interpreter's scheduler: cffi releases the GIL around
out-of-line calls. One table (:data:`EXTENSIONS`) says what each extension exports, so adding
a C function is one line here and the function itself.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Extension:
    module: str  # the importable name under ``package``, e.g. "_ringcore"
    source: str  # the C file, in the package's directory
    cdef: str  # what Python may call
    package: str = "crane.wire"

    @property
    def directory(self) -> Path:
        return HERE.parents[1].joinpath(*self.package.split("."))


EXTENSIONS = (
    Extension(
        "_ringcore",
        "ringcore.c",
        """
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
""",
    ),
    Extension(
        "_bulkcore",
        "bulkcore.c",
        """
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
""",
    ),
    Extension(
        "_fillcore",
        "fillcore.c",
        """
void crane_fill_run(char *base, const uint64_t *off, const uint32_t *value, const uint32_t *elem,
                    const uint64_t *count, uint64_t n);
""",
        package="crane.backends.sim",
    ),
    Extension(
        "_callq",
        "callqcore.c",
        """
uint64_t crane_callq_bytes(uint64_t cap);
int crane_callq_init(void *mem, uint64_t cap);
void crane_callq_destroy(void *mem);
int crane_callq_layout(void *mem, uint32_t op, const uint8_t *widths, uint32_t n);
void crane_callq_attend(void *mem, uint32_t on);
int64_t crane_callq_put(void *mem, uint32_t op, uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3,
                        uint64_t a4);
uint64_t crane_callq_next_seq(void *mem);
uint64_t crane_callq_count(void *mem);
uint64_t crane_callq_take(void *mem, void *dst, uint64_t room, uint64_t *last);
""",
        package="crane.guest",
    ),
)


def builder(ext: Extension) -> FFI:
    ffi = FFI()
    ffi.cdef(ext.cdef)
    ffi.set_source(
        f"{ext.package}.{ext.module}",
        (ext.directory / ext.source).read_text(),
        include_dirs=[str(HERE)],  # shm_futex.h
        extra_compile_args=["-O2", "-std=gnu11"],
        # the stable ABI: one build serves every CPython 3 interpreter, so an application's
        # own (a torch venv's 3.12, say) loads it as well as the one that built it
        py_limited_api=True,
    )
    return ffi


def build_one(ext: Extension, dest: Path | None = None) -> Path:
    """Compile one extension and place it in ``dest`` (its package's directory)."""
    dest = dest or ext.directory
    with tempfile.TemporaryDirectory(prefix=f"crane{ext.module}-") as tmp:
        out = Path(builder(ext).compile(tmpdir=tmp, verbose=False))
        target = dest / out.name
        # replaced, not overwritten: a process that has the old one mapped keeps it intact
        part = target.with_name(target.name + ".part")
        shutil.copy2(out, part)
        os.replace(part, target)
    for stale in dest.glob(f"{ext.module}.*.so"):  # an earlier build's other suffix would shadow it
        if stale != target:
            stale.unlink()
    return target


def build(dest: Path | None = None) -> list[Path]:
    """Compile every extension (into ``dest`` if given, else each into its package)."""
    return [build_one(ext, dest) for ext in EXTENSIONS]


if __name__ == "__main__":
    for path in build():
        print(path)
