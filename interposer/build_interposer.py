"""Build the guest library ``libcuda.so.1`` with cffi in embedding mode.

The C entry points (interposer/src hand-written, interposer/generated from the spec) are
compiled into one shared library whose Python-served symbols start the embedded interpreter on
first use and call :mod:`crane.interposer`. The interpreter cannot rely on PATH to find our
packages (a guest program runs outside any venv), so the build records where Crane and its
guest dependencies are into the library's start-up code (BOOT, run by interposer/src/pygate.c),
and links libpython with an rpath to its directory.

One build serves one interpreter (its headers, its libpython): this script builds Crane's own;
crane/cli/guest_runtime.py builds one per application interpreter with :func:`build`. cffi
only writes the module's C source here (it is the same for every interpreter); the compiler is
run directly with the target interpreter's include directory.

The package build (setup.py) ships this script with src/ and generated/ inside the package
(``crane/interposer/_build/``), so an installed Crane without its source tree can still build
a library for an interpreter (``crane guest-lib --build``, ``crane guest-lib --python``): in
that copy, the output folder is the package's ``_lib`` and the requirements come from the
installed distribution's metadata instead of pyproject.toml.

    python interposer/build_interposer.py [--out DIR]     (also run by setup.py and setup.sh)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: A source checkout (interposer/ beside pyproject.toml), or the copy shipped in the package.
IN_CHECKOUT = (ROOT / "pyproject.toml").is_file()
DEFAULT_OUT = ROOT / "crane" / "interposer" / "_lib" if IN_CHECKOUT else ROOT / "_lib"
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
int crane_fast_arm(uint64_t q, uint64_t put_addr, uint64_t capacity, uint32_t memset_op,
                   uint32_t event_record_op, uint32_t stream_wait_op, uint32_t copy_op);
uint64_t crane_fast_gen(void);
void crane_fast_forget(void);
void crane_fast_learn(uint64_t g, uint64_t start, uint64_t end, uint64_t stream,
                      uint64_t event);
"""


def _python_callable() -> str:
    """The declarations crane_cuda.h marks as called from Python (host memory)."""
    text = (HERE / "src" / "crane_cuda.h").read_text()
    begin = text.index("/* python-callable begin")
    return text[text.index("\n", begin) + 1 : text.index("/* python-callable end */")]


EXTRA_API = "int crane_py_primary_reset(int dev);\nint crane_py_fast_queued(long long n);\n"

# cffi's init code: by the time it runs, interposer/src/pygate.c has put Crane's paths in place
# and imported the guest side (BOOT below), so this only wires the handlers.
INIT = """
from _crane_libcuda import ffi, lib
from crane.interposer.bind import install
install(ffi, lib)
lib.crane_py_mark_started()
"""

# Run by pygate.c in the process's interpreter before cffi's own start-up (which imports
# _cffi_backend before any init code could set a path). pygate.c sets ``owner`` (the library
# started this interpreter: a C program) and ``self_path`` (this library's file) and reads
# ``problem`` back. The build fills in the paths and Crane's guest requirements.
BOOT = """
import sys
paths = {paths!r}
if {add_root!r}:  # <root>/crane/interposer/_lib/libcuda.so.1: the package it was installed with
    paths.append(self_path.rsplit("/", 4)[0])
app_paths = list(sys.path)
if owner:
    sys.path[:0] = [p for p in paths if p not in sys.path]
else:
    sys.path.extend(p for p in paths if p not in sys.path)
from crane.interposer.guest_env import enter
problem = enter(owner, app_paths, paths, {requirements!r})
"""


class Interpreter(NamedTuple):
    """What a build for one Python interpreter needs to know about it (a NamedTuple: setup.py
    loads this file without registering it as a module, which a dataclass needs)."""

    executable: str
    version: str  # "3.12"
    include: str
    libpython: str | None  # the shared libpython to link, None when it has none

    @property
    def libdir(self) -> str | None:
        return str(Path(self.libpython).parent) if self.libpython else None


_PROBE = r"""
import glob, json, os, sys, sysconfig
v = sysconfig.get_config_var
ver = "%d.%d" % sys.version_info[:2]
dirs = [v("LIBDIR") or "", os.path.join(sys.base_prefix, "lib"),
        "/usr/lib/" + (v("MULTIARCH") or "x86_64-linux-gnu"), "/usr/lib64", "/usr/lib"]
names = [v("LDLIBRARY") or "", v("INSTSONAME") or "", "libpython%s.so" % ver,
         "libpython%s.so.1.0" % ver]
lib = next((os.path.join(d, n) for d in dirs for n in names
            if d and n.endswith((".so", ".so.1.0")) and os.path.isfile(os.path.join(d, n))),
           None)
print(json.dumps({"executable": sys.executable, "version": ver,
                  "include": sysconfig.get_paths()["include"], "libpython": lib}))
"""


def probe(python: str | None = None) -> Interpreter:
    """``python``'s build facts (this interpreter's when None): asked of it, since headers
    and libpython belong to the interpreter that will run the library's Python side."""
    cmd = [python or sys.executable, "-I", "-S", "-c", _PROBE]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return Interpreter(**json.loads(out))


def _import_root() -> None:
    """Make ``crane`` importable from the checkout (an installed copy already is)."""
    if IN_CHECKOUT and str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def _dependencies() -> list[str]:
    """Crane's run-time requirements: pyproject.toml's in a checkout, else the installed
    distribution's (its metadata, without the extras' entries)."""
    if IN_CHECKOUT:
        return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    from importlib import metadata

    return [r for r in metadata.requires("crane") or [] if ";" not in r]


def guest_requirements() -> list[str]:
    """Crane's requirement for each guest dependency, for the conflict check
    (crane/interposer/guest_env.py) and the per-interpreter install."""
    _import_root()
    from crane.interposer.guest_env import GUEST_DISTRIBUTIONS, parse_requirement

    return [d for d in _dependencies() if parse_requirement(d).name in GUEST_DISTRIBUTIONS]


def _c_string(text: str) -> str:
    """``text`` as a C string literal (one line per source line, octal escapes)."""

    def esc(line: str) -> str:
        return "".join(
            c
            if 32 <= ord(c) < 127 and c not in '"\\?'
            else "".join(f"\\{b:03o}" for b in c.encode())
            for c in line
        )

    return "\n".join(f'    "{esc(line)}\\n"' for line in text.splitlines())


def _make_ffi() -> Any:
    import cffi

    _import_root()
    from crane.codegen.gen_interposer import embedding_api

    ffi = cffi.FFI()
    ffi.embedding_api(embedding_api() + EXTRA_API)
    ffi.cdef(C_API + _python_callable())
    ffi.set_source("_crane_libcuda", '#include "crane_cuda.h"\n#include "impl.h"\n')
    ffi.embedding_init_code(INIT)
    return ffi


def build(
    out_dir: Path = DEFAULT_OUT,
    site_dirs: list[str] | None = None,
    python: str | None = None,
    private_paths: list[str] | None = None,
    interpreter: Interpreter | None = None,
    rpath: str | None = None,
) -> Path:
    """Build the library into ``out_dir`` for ``python`` (this interpreter when None).

    A build for an interpreter that cannot run here (a VM image's: vm-images/build.py) gives
    its facts as ``interpreter`` instead, and ``rpath``, the directory libpython lies in where
    the library will run (default: the directory it was linked from).

    Crane's own build (``private_paths`` None): its Python side finds Crane's dependencies in
    ``site_dirs`` (default: this interpreter's site-packages) and Crane in the package the
    library was installed with. A build for an application's interpreter (crane/cli/guest_
    runtime.py) gets ``private_paths`` instead: a directory holding only Crane's guest
    dependencies for that interpreter and the ``crane`` package."""
    interp = interpreter or probe(python)
    if interp.libpython is None and private_paths is None:
        # Crane's own library serves C programs, which need it to bring its interpreter
        raise RuntimeError(
            f"no shared libpython{interp.version} found for {interp.executable}: install it "
            "(pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared; Debian: libpython3.X-dev)"
        )
    if private_paths is not None:
        paths, add_root = list(private_paths), False
    else:
        if site_dirs is None:
            sp = sysconfig.get_paths()
            site_dirs = sorted({sp["purelib"], sp["platlib"]})
        paths, add_root = list(site_dirs), True
    boot = BOOT.format(paths=paths, add_root=add_root, requirements=guest_requirements())
    sources = sorted(str(p) for p in (HERE / "src").glob("*.c"))
    sources += [str(HERE / "generated" / "entries.c"), str(HERE / "generated" / "procs.c")]
    link = [interp.libpython, f"-Wl,-rpath,{rpath or interp.libdir}"] if interp.libpython else []
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="crane-interposer-") as tmp:
        module_c = Path(tmp) / "_crane_libcuda.c"
        with contextlib.redirect_stdout(io.StringIO()):  # cffi announces the file it writes
            _make_ffi().emit_c_code(str(module_c))
        (Path(tmp) / "crane_boot.h").write_text(
            f"static const char crane_boot_code[] =\n{_c_string(boot)};\n"
        )
        built = Path(tmp) / SONAME
        cc = os.environ.get("CC", "cc")
        cmd = [cc, "-shared", "-fPIC", "-O2", "-fwrapv", "-DNDEBUG", "-Wall",
               "-Wno-unused-function", f"-I{interp.include}", f"-I{tmp}", f"-I{HERE / 'src'}",
               f"-I{HERE / 'generated'}", "-o", str(built), str(module_c), *sources,
               f"-Wl,-soname,{SONAME}", *link, "-lpthread", "-ldl"]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"compiling the guest library failed:\n{r.stderr[-4000:]}")
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
