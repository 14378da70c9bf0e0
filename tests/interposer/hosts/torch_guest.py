"""PyTorch (the PyPI wheel, unmodified) as a guest on a simulated GPU. Run under ``crane run``
on ``sim:ptx-next``. What runs: device queries, allocation, copies both ways, matrix products
(cuBLAS/cuBLASLt) and a convolution (cuDNN), which take their PTX paths on that device, each
checked against the CPU.
What cannot: torch's own kernels are machine code for real GPUs only (libtorch_cuda.so holds
no PTX), so an elementwise op must fail with a clear CUDA error, and the process go on."""

from __future__ import annotations

import time

from guest_checks import check, close, finish

t0, c0 = time.perf_counter(), time.process_time()
import torch  # noqa: E402

# wall and CPU seconds (the process's own CPU time: what a loaded machine does not stretch)
print(f"import {time.perf_counter() - t0:.3f} {time.process_time() - c0:.3f}", flush=True)
gen = torch.Generator().manual_seed(13)


@check("is_available")
def _() -> None:
    assert torch.cuda.is_available()
    assert torch.cuda.device_count() == 1, torch.cuda.device_count()


@check("device_properties")
def _() -> None:
    name = torch.cuda.get_device_name(0)
    assert "Crane simulated GPU" in name, name
    p = torch.cuda.get_device_properties(0)
    assert (p.major, p.minor) == (13, 0), (p.major, p.minor)
    assert torch.cuda.get_device_capability(0) == (13, 0)
    assert p.total_memory > 1 << 30 and p.multi_processor_count > 0, p


@check("mem_get_info")
def _() -> None:
    free, total = torch.cuda.mem_get_info()
    assert total == torch.cuda.get_device_properties(0).total_memory, (free, total)
    assert 0 < free <= total, (free, total)


@check("allocation")
def _() -> None:
    before = torch.cuda.memory_allocated()
    t = torch.empty(1 << 20, dtype=torch.float32, device="cuda")
    assert t.is_cuda and torch.cuda.memory_allocated() - before >= 4 << 20
    del t
    torch.cuda.synchronize()


@check("copies_round_trip")
def _() -> None:
    for dtype in (torch.float32, torch.float16, torch.int64, torch.uint8):
        x = (torch.rand(1000, 37, generator=gen) * 100).to(dtype)
        g = x.to("cuda")
        h = torch.empty_like(g).copy_(g)  # device to device
        assert torch.equal(h.cpu(), x), dtype
        pinned = torch.empty_like(x).pin_memory()
        pinned.copy_(g, non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(pinned, x), dtype


@check("mm_cublas")
def _() -> None:
    a = torch.randn(64, 48, generator=gen)
    b = torch.randn(48, 32, generator=gen)
    close(torch.mm(a.cuda(), b.cuda()).cpu().numpy(), (a @ b).numpy(), 1e-4, 1e-4)
    c = torch.randn(32, 40, generator=gen)
    close((b.cuda().t() @ a.cuda().t()).cpu().numpy(), (b.t() @ a.t()).numpy(), 1e-4, 1e-4)
    close(torch.mm(b.cuda(), c.cuda()).cpu().numpy(), (b @ c).numpy(), 1e-4, 1e-4)


@check("bmm_cublas")
def _() -> None:
    a = torch.randn(6, 16, 32, generator=gen)
    b = torch.randn(6, 32, 24, generator=gen)
    close(torch.bmm(a.cuda(), b.cuda()).cpu().numpy(), torch.bmm(a, b).numpy(), 1e-4, 1e-4)


@check("linear_bias_cublaslt")
def _() -> None:
    """addmm with a bias: cuBLASLt's GEMM with a bias epilogue."""
    x, w, bias = (torch.randn(*s, generator=gen) for s in ((10, 32), (20, 32), (20,)))
    got = torch.nn.functional.linear(x.cuda(), w.cuda(), bias.cuda()).cpu()
    close(got.numpy(), torch.nn.functional.linear(x, w, bias).numpy(), 1e-4, 1e-4)


@check("mm_fp16_cublas")
def _() -> None:
    a = torch.randn(32, 64, generator=gen).half()
    b = torch.randn(64, 16, generator=gen).half()
    got = (a.cuda() @ b.cuda()).cpu().float()
    close(got.numpy(), (a.float() @ b.float()).numpy(), 1e-2, 2e-2)


@check("conv2d_cudnn")
def _() -> None:
    """cuDNN's engines ship PTX for compute_121, which a compute 13.0 device runs."""
    img = torch.randn(2, 3, 10, 10, generator=gen)
    k = torch.randn(4, 3, 3, 3, generator=gen)
    got = torch.nn.functional.conv2d(img.cuda(), k.cuda(), padding=1).cpu()
    close(got.numpy(), torch.nn.functional.conv2d(img, k, padding=1).numpy(), 1e-4, 1e-4)


@check("sass_only_kernel_fails_clearly")
def _() -> None:
    g = torch.ones(16).to("cuda")
    try:
        (g + g).cpu()
    except RuntimeError as e:
        assert "no kernel image is available" in str(e), e
    else:
        raise AssertionError("torch's elementwise kernel ran: it holds no PTX to run")
    # not a sticky error: the process goes on using the device
    close(g.cpu().numpy(), torch.ones(16).numpy(), 0, 0)


finish()
