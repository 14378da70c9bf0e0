"""Real module images for the module-layer tests, compiled once per session with nvcc.

Why compile instead of checking in binaries: the point of these tests is that the readers
understand what *this* toolkit emits; every artifact is rebuilt from the CUDA source below,
all builds run in parallel on first use, and the whole set is skipped (with a reason) on a
machine without nvcc.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from crane.modules.elf import parse_elf

KERNELS_CU = r"""
struct Inner { int i; double d; char c; };          // 24 bytes, align 8
struct Padded { char a; int b; short c; };           // 12 bytes, align 4
struct Big { char bytes[20000]; };                   // too big for KPARAM_INFO v1

__device__ int table[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
__constant__ float coeffs[4];
__constant__ double cinit[2] = {1.5, -2.25};
__device__ double gscalar;
__shared__ float modshared[32];

__device__ __noinline__ float helper(float x) { return x * x + table[3]; }

extern "C" __global__ void weird(char a, Inner s, short h, double* p, float4 v) {
  __shared__ float buf[64];
  buf[threadIdx.x] = v.x + a + s.d + h;
  __syncthreads();
  p[threadIdx.x] = buf[threadIdx.x ^ 1] + coeffs[0] + cinit[1] + gscalar;
}

extern "C" __global__ void __launch_bounds__(128, 2)
scalars(int a, float b, double c, long long d, unsigned char e, short f, int* out) {
  out[threadIdx.x] = a + (int)b + (int)c + (int)d + e + f;
}

extern "C" __global__ void vectors(float4 a, double2 b, char3 c, int2 d, Padded p,
                                   const float* __restrict__ q, float* out) {
  out[0] = a.w + b.y + c.z + d.y + p.c + q[1];
}

extern "C" __global__ void empty() {}

extern "C" __global__ void dynshared(float* o) {
  extern __shared__ float dyn[];
  dyn[threadIdx.x] = 1.0f;
  __syncthreads();
  o[threadIdx.x] = dyn[threadIdx.x ^ 1];
}

extern "C" __global__ void uses_modshared(float* o) {
  modshared[threadIdx.x] = helper(o[0]);
  __syncthreads();
  o[threadIdx.x] = modshared[threadIdx.x ^ 3];
}

extern "C" __global__ void bigparam(Big b, int* out) { out[0] = b.bytes[19999]; }

__global__ void mangled(int x, int* out) { out[0] = x; }

int main() { return 0; }
"""

#: Hand-written PTX: a .reqntid kernel and nvcc's pointer-annotated parameter form.
HANDWRITTEN_PTX = """\
.version 8.0
.target sm_80
.address_size 64

.visible .entry annotated(
\t.param .u64 .ptr .global .align 16 annotated_param_0,
\t.param .u32 annotated_param_1,
\t.param .u64 .ptr .align 1 annotated_param_2,
\t.param .align 4 .b8 annotated_param_3[12]
)
.reqntid 64, 2, 1
{
\t.reg .b64 %rd<3>;
\t.reg .b32 %r<2>;
\tld.param.u64 %rd1, [annotated_param_0];
\tld.param.u32 %r1, [annotated_param_1];
\tcvta.to.global.u64 %rd2, %rd1;
\tst.global.u32 [%rd2], %r1;
\tret;
}
"""


@dataclass(frozen=True)
class Build:
    """Flags for one artifact; ``kind`` is the nvcc output mode."""

    flags: tuple[str, ...]
    suffix: str
    source: str = "kernels.cu"


BUILDS: dict[str, Build] = {
    "default": Build(("-fatbin",), ".fatbin"),
    "compress_all": Build(("-fatbin", "-Xfatbin", "-compress-all"), ".fatbin"),
    "lz4": Build(("-fatbin", "--compress-mode=speed"), ".fatbin"),
    "lz4_all": Build(("-fatbin", "--compress-mode=speed", "-Xfatbin", "-compress-all"), ".fatbin"),
    "no_compress": Build(("-fatbin", "--no-compress"), ".fatbin"),
    "multi": Build(
        (
            "-fatbin",
            "-gencode=arch=compute_75,code=sm_75",
            "-gencode=arch=compute_80,code=sm_80",
            "-gencode=arch=compute_90,code=sm_90",
            "-gencode=arch=compute_90,code=compute_90",
        ),
        ".fatbin",
    ),
    "sm90_only": Build(("-fatbin", "-gencode=arch=compute_90,code=sm_90"), ".fatbin"),
    "sm90a": Build(("-fatbin", "-gencode=arch=compute_90a,code=[sm_90a,compute_90a]"), ".fatbin"),
    "sm100f": Build(("-fatbin", "-gencode=arch=compute_100f,code=sm_100f"), ".fatbin"),
    "cubin80": Build(("-cubin", "-arch=sm_80"), ".cubin"),
    "cubin90": Build(("-cubin", "-arch=sm_90"), ".cubin"),
    "cubin_rdc": Build(("-cubin", "-rdc=true", "-arch=sm_80"), ".cubin"),
    "ptx80": Build(("-ptx", "-arch=sm_80"), ".ptx"),
    "exe": Build((), ""),
    "handwritten_cubin": Build(("-cubin", "-arch=sm_80"), ".cubin", "handwritten.ptx"),
}


def find_nvcc() -> str | None:
    """nvcc on PATH, else the one the ``nvidia-cuda-nvcc`` wheel installs in site-packages."""
    found = shutil.which("nvcc")
    if found:
        return found
    roots = [*site.getsitepackages(), site.getusersitepackages()]
    for root in roots:
        candidate = Path(root) / "nvidia" / "cuda_nvcc" / "bin" / "nvcc"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _wheel_includes(nvcc: str) -> list[str]:
    """Header directories of the CUDA wheels next to a pip-installed nvcc."""
    nvidia = Path(nvcc).resolve().parents[2]
    if nvidia.name != "nvidia":
        return []
    return [f"-I{p}" for p in sorted(nvidia.glob("*/include")) if p.is_dir()]


@pytest.fixture(scope="session")
def nvcc_path() -> str:
    path = find_nvcc()
    if path is None:
        pytest.skip("nvcc not found on PATH nor as the nvidia-cuda-nvcc wheel in site-packages")
    return path


@pytest.fixture(scope="session")
def builds(nvcc_path: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Every artifact in :data:`BUILDS`, compiled in parallel, as bytes."""
    root = tmp_path_factory.mktemp("modules-nvcc")
    (root / "kernels.cu").write_text(KERNELS_CU)
    (root / "handwritten.ptx").write_text(HANDWRITTEN_PTX)
    extra = _wheel_includes(nvcc_path)

    def compile_one(item: tuple[str, Build]) -> tuple[str, Path]:
        name, build = item
        out = root / f"{name}{build.suffix}"
        cmd = [nvcc_path, *extra, *build.flags, "-o", str(out), str(root / build.source)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
        return name, out

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        paths = dict(pool.map(compile_one, BUILDS.items()))
    return {name: path.read_bytes() for name, path in paths.items()}


@pytest.fixture(scope="session")
def nv_fatbin_section(builds: dict[str, bytes]) -> bytes:
    """The ``.nv_fatbin`` section of the host executable: several concatenated fatbins."""
    elf = parse_elf(builds["exe"])
    sec = elf.section(".nv_fatbin")
    assert sec is not None, "the executable has no .nv_fatbin section"
    return elf.section_data(sec)
