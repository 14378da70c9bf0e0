"""Modules through a daemon: fatbin, cubin and PTX images built by nvcc in the test,
parameter layouts, globals, content addressing, and refusals with precise reasons."""

from __future__ import annotations

import pytest

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession

SOURCE = r"""
struct Weird { int a; double b; char c; };
__device__ int table[4] = {1, 2, 3, 4};
__constant__ float coeffs[8];
extern "C" __global__ void weird(char c, Weird w, short s, double *p, float4 v)
{
    if (threadIdx.x == 0) p[0] = c + w.a + w.b + w.c + s + v.x + table[1] + coeffs[0];
}
extern "C" __global__ void scale(float *x, float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
"""

WEIRD = ((0, 1), (8, 24), (32, 2), (40, 8), (48, 16))


@pytest.mark.parametrize(
    "flags",
    [
        ("-fatbin", "-arch=sm_90"),
        (
            "-fatbin",
            "-gencode",
            "arch=compute_80,code=sm_80",
            "-gencode",
            "arch=compute_80,code=compute_80",
            "-Xfatbin",
            "-compress-all",
        ),
        ("-fatbin", "-arch=sm_90"),  # sm_90 SASS with compute_90 PTX (a bare cubin is refused)
        ("-ptx", "-arch=compute_75"),
    ],
    ids=["fatbin", "fatbin-compressed", "fatbin-sass-and-ptx", "ptx"],
)
def test_load_reports_layouts_and_globals(session: GuestSession, cuda_build, flags) -> None:  # type: ignore[no-untyped-def]
    suffix = {"-fatbin": ".fatbin", "-cubin": ".cubin", "-ptx": ".ptx"}[flags[0]]
    image = cuda_build(SOURCE, *flags, suffix=suffix).read_bytes()
    mod = session.module_load(image)
    assert set(mod.kernels) == {"weird", "scale"}
    assert mod.kernels["weird"].params == WEIRD and mod.kernels["weird"].param_bytes == 64
    assert mod.kernels["scale"].params == ((0, 8), (8, 4), (12, 4))
    addr, size = session.module_get_global(mod, "table")
    assert size == 16
    assert session.memcpy_dtoh(addr, 16) == b"".join(i.to_bytes(4, "little") for i in (1, 2, 3, 4))
    caddr, csize = session.module_get_global(mod, "coeffs")
    assert csize == 32
    session.memcpy_htod(caddr, bytes(range(32)))  # cudaMemcpyToSymbol
    assert session.memcpy_dtoh(caddr, 32) == bytes(range(32))
    fn = session.module_get_function(mod, "scale")
    assert fn.layout.param_bytes == 16
    with pytest.raises(CudaError) as e:
        session.module_get_function(mod, "nope")
    assert e.value.code == CUresult.CUDA_ERROR_NOT_FOUND
    session.module_unload(mod)


def test_images_are_sent_once(daemon: DaemonProcess, cuda_build) -> None:  # type: ignore[no-untyped-def]
    image = cuda_build(SOURCE, "-fatbin", "-arch=sm_90").read_bytes()
    with GuestSession(daemon.address) as a:
        a.module_load(image)
    sent = []
    with GuestSession(daemon.address) as b:
        real = b._t.enqueue

        def spy(op, args, data=b"", **kw):  # type: ignore[no-untyped-def]
            sent.append((op.name, len(data)))
            return real(op, args, data, **kw)

        b._t.enqueue = spy  # type: ignore[method-assign]
        mod = b.module_load(image)
        assert "scale" in mod.kernels
    assert ("MODULE_LOAD", 0) in sent and all(n == 0 for name, n in sent if name == "MODULE_LOAD")


def test_no_code_for_the_device_is_refused_precisely(tmp_path, cuda_build) -> None:  # type: ignore[no-untyped-def]
    image = cuda_build(SOURCE, "-cubin", "-arch=sm_90").read_bytes()
    with DaemonProcess(tmp_path / "run", ["sim:a100-40gb"]) as d, GuestSession(d.address) as s:
        with pytest.raises(CudaError) as e:
            s.module_load(image)
        assert e.value.code == CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU
        assert "sm_90" in e.value.message and "sm_80" in e.value.message
        assert "NO_BINARY_FOR_GPU" in d.log_text()


def test_garbage_image_is_invalid(session: GuestSession) -> None:
    with pytest.raises(CudaError) as e:
        session.module_load(b"\x50\xed\x55\xba" + b"\x00" * 40)
    assert e.value.code == CUresult.CUDA_ERROR_INVALID_IMAGE
    with pytest.raises(CudaError) as e:
        session.module_load(b"definitely not a module")
    assert e.value.code == CUresult.CUDA_ERROR_INVALID_IMAGE
    session.synchronize()


def test_launch_checks_before_execution(session: GuestSession, cuda_build) -> None:  # type: ignore[no-untyped-def]
    mod = session.module_load(cuda_build(SOURCE, "-fatbin", "-arch=sm_90").read_bytes())
    fn = session.module_get_function(mod, "scale")
    x = session.mem_alloc(4 * 100)
    for grid, block, shared in [
        ((1,), (2048,), 0),
        ((1,), (0,), 0),
        ((2**31,), (1,), 0),
        ((1,), (1, 1, 65), 0),
        ((1,), (32,), 1 << 20),
    ]:
        with pytest.raises(CudaError) as e:
            session.launch(fn, grid, block, [x, 2.0, 100], shared=shared)
        assert e.value.code == CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(CudaError) as e:
        session.launch(fn, (1,), (32,), [x, 2.0])
    assert e.value.code == CUresult.CUDA_ERROR_INVALID_VALUE


def test_cubin_only_module_is_refused_at_load_on_the_simulator(
    session: GuestSession, cuda_build
) -> None:  # type: ignore[no-untyped-def]
    """As a driver refuses a module with no code for its device at cuModuleLoadData (it was
    accepted and failed at its first launch, the error surfacing on a later call); the
    session goes on unharmed."""
    with pytest.raises(CudaError) as e:
        session.module_load(cuda_build(SOURCE, "-cubin", "-arch=sm_90").read_bytes())
    assert e.value.code == CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU
    assert "code=compute_90" in e.value.message
    x = session.mem_alloc(400)
    session.memset_d32(x, 7, 100)
    assert session.memcpy_dtoh(x, 8) == bytes([7, 0, 0, 0]) * 2
    session.synchronize()
