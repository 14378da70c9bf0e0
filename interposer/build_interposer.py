"""Build the guest library ``libcuda.so.1`` with cffi in embedding mode.

The C entry points (interposer/src hand-written, interposer/generated from the spec) are
compiled into one shared library whose Python-served symbols start the embedded interpreter on
first use and call :mod:`crane.interposer`. The interpreter cannot rely on PATH to find our
packages (a guest program runs outside any venv), so the build records the import path it was
built with into the library's init code, and links libpython with an rpath to its directory.

    python interposer/build_interposer.py [--out DIR]     (also run by setup.py and setup.sh)
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_OUT = ROOT / "crane" / "interposer" / "_lib"
SONAME = "libcuda.so.1"

# Functions of the C side the Python side calls (besides the entry points themselves).
C_API = """
void *crane_ctx_current(void);
int crane_in_ptds(void);
void *crane_primary_ctx(int dev);
int crane_primary_dev(void *ctx);
void crane_ctx_forget(void *ctx);
int crane_c_cuCtxPushCurrent_4000(void *ctx);
int crane_reserve_window(unsigned long long base, unsigned long long size);
const char *crane_self_path(void);
"""


def _python_callable() -> str:
    """The declarations crane_cuda.h marks as called from Python (host memory)."""
    text = (HERE / "src" / "crane_cuda.h").read_text()
    begin = text.index("/* python-callable begin")
    return text[text.index("\n", begin) + 1 : text.index("/* python-callable end */")]

EXTRA_API = "int crane_py_primary_reset(int dev);\n"

INIT = """
import os, site, sys
for _p in {site_dirs!r}:
    site.addsitedir(_p)
from _crane_libcuda import ffi, lib
_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    ffi.string(lib.crane_self_path()).decode()))))
for _p in [*{roots!r}, _root]:
    if _p and _p not in sys.path:
        sys.path.insert(0, _p)
from crane.interposer.bind import install
install(ffi, lib)
lib.crane_py_mark_started()
"""


def build(out_dir: Path = DEFAULT_OUT, site_dirs: list[str] | None = None) -> Path:
    """Build the library into ``out_dir``. ``site_dirs``: where the embedded interpreter finds
    crane's dependencies (default: this interpreter's; the library's own install root is always
    searched, which suffices for a wheel installed with its dependencies)."""
    import cffi

    sys.path.insert(0, str(ROOT))
    from crane.codegen.gen_interposer import embedding_api

    ffi = cffi.FFI()
    ffi.embedding_api(embedding_api() + EXTRA_API)
    ffi.cdef(C_API + _python_callable())
    sources = sorted(str(p) for p in (HERE / "src").glob("*.c"))
    sources += [str(HERE / "generated" / "entries.c"), str(HERE / "generated" / "procs.c")]
    libdir = sysconfig.get_config_var("LIBDIR")
    ffi.set_source(
        "_crane_libcuda",
        '#include "crane_cuda.h"\n#include "impl.h"\n',
        sources=sources,
        include_dirs=[str(HERE / "src"), str(HERE / "generated")],
        libraries=["pthread", "dl"],
        extra_compile_args=["-O2", "-Wall", "-Wno-unused-function"],
        extra_link_args=[f"-Wl,-soname,{SONAME}", f"-Wl,-rpath,{libdir}"],
    )
    if site_dirs is None:
        paths = sysconfig.get_paths()
        site_dirs = sorted({paths["purelib"], paths["platlib"]})
    ffi.embedding_init_code(INIT.format(site_dirs=site_dirs, roots=[]))
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="crane-interposer-") as tmp:
        built = Path(ffi.compile(tmpdir=tmp, target=SONAME, verbose=False))
        dest = out_dir / SONAME
        tmp_dest = dest.with_suffix(".tmp")
        tmp_dest.write_bytes(built.read_bytes())
        tmp_dest.chmod(0o755)
        tmp_dest.replace(dest)  # atomic: a running guest keeps its mapped copy
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    print(build(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
