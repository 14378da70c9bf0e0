"""Fixtures for the PTX interpreter tests: nvcc discovery, compiled-PTX cache, a device.

The kernels in ``kernels/*.cu`` are compiled with the real nvcc during the test run, to PTX for
each architecture in :data:`ARCHS`, once per session (in parallel, into a temporary
directory). The ``nvcc`` fixture (tests/conftest.py) finds the compiler on PATH or in the pip
package nvidia-cuda-nvcc and skips with a reason when there is none.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ptxdev import Device

KERNELS = Path(__file__).parent / "kernels"


@pytest.fixture(autouse=True, scope="module")
def _differential() -> Iterator[None]:
    """Every launch of the PTX tests runs both ways, compiled and interpreted, from the same
    memory and must give the same bytes (crane/backends/sim/ptx/jit/diff.py): the differential
    test of the PTX compiler over the whole PTX test suite. CRANE_PTX_JIT=0 in the environment
    tests the interpreter alone.

    Set for these modules only, and undone after each: set at import (as it once was), it
    reached every daemon the rest of the suite started, whose workers then compared all of a
    session's memory after every launch (a migration test's 256 MiB guest took minutes)."""
    with pytest.MonkeyPatch.context() as mp:
        if "CRANE_PTX_JIT" not in os.environ:
            mp.setenv("CRANE_PTX_JIT", "diff")
        yield


@pytest.fixture
def compile_every_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compile a kernel at its first launch however small: the compiler's own tests
    (``pytestmark = pytest.mark.usefixtures("compile_every_launch")``) look at compiled
    launches, which ``on`` mode otherwise keeps for launches of ``COMPILE_MIN_LANES``
    threads or a kernel's third launch."""
    from crane.backends.sim.ptx import jit

    monkeypatch.setattr(jit, "COMPILE_MIN_LANES", 1)


ARCHS = ("compute_75", "compute_80", "compute_90")


class PtxCache:
    """Compiles kernels/NAME.cu for an arch on first request (all of them up front)."""

    def __init__(self, nvcc: str, outdir: Path) -> None:
        self.nvcc = nvcc
        self.outdir = outdir
        self._texts: dict[tuple[str, str], str] = {}
        self._errors: dict[tuple[str, str], str] = {}

    def _compile(self, name: str, arch: str) -> None:
        src = KERNELS / f"{name}.cu"
        out = self.outdir / f"{name}_{arch}.ptx"
        cmd = [self.nvcc, "-ptx", "-O3", f"-arch={arch}", str(src), "-o", str(out)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            self._errors[(name, arch)] = r.stderr
        else:
            self._texts[(name, arch)] = out.read_text()

    def compile_all(self) -> None:
        jobs = [(p.stem, a) for p in sorted(KERNELS.glob("*.cu")) for a in ARCHS]
        with ThreadPoolExecutor(max_workers=max(os.cpu_count() or 1, 1)) as ex:
            list(ex.map(lambda j: self._compile(*j), jobs))

    def get(self, name: str, arch: str) -> str:
        key = (name, arch)
        if key not in self._texts and key not in self._errors:
            self._compile(name, arch)
        if key in self._errors:
            raise RuntimeError(f"nvcc failed for {name}.cu ({arch}):\n{self._errors[key]}")
        return self._texts[key]


@pytest.fixture(scope="session")
def ptx_cache(nvcc: str, tmp_path_factory: pytest.TempPathFactory) -> PtxCache:
    cache = PtxCache(nvcc, tmp_path_factory.mktemp("ptx"))
    cache.compile_all()
    return cache


_PROGRAMS: dict[tuple[str, str], object] = {}


@pytest.fixture(scope="session")
def program(ptx_cache: PtxCache):
    """program(name, arch) -> PtxProgram (loaded once per session)."""
    from crane.backends.sim.ptx import load_ptx

    def get(name: str, arch: str):
        key = (name, arch)
        if key not in _PROGRAMS:
            _PROGRAMS[key] = load_ptx(ptx_cache.get(name, arch))
        return _PROGRAMS[key]

    return get


@pytest.fixture(params=ARCHS)
def arch(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def dev() -> Device:
    d = Device()
    yield d
    d.close()


@pytest.fixture
def rng(request: pytest.FixtureRequest):
    import numpy as np

    # fresh random inputs each run; the seed is printed on failure for reproduction
    seed = int.from_bytes(os.urandom(4), "little")
    request.node.user_properties.append(("seed", seed))
    print(f"random seed {seed}")
    return np.random.default_rng(seed)


def pytest_terminal_summary(terminalreporter) -> None:
    """How many kernels the PTX compiler took, and why it refused the others."""
    from crane.backends.sim.ptx import jit

    st = jit.stats()
    if not st["compiled"] and not st["refused"]:
        return
    tr = terminalreporter
    tr.section("PTX compiler")
    tr.write_line(
        f"{len(st['compiled'])} kernels compiled (checked against the interpreter), "
        f"{len(st['refused'])} run interpreted"
    )
    for name, why in sorted(st["refused"]):
        tr.write_line(f"  interpreted: {name}: {why}")
