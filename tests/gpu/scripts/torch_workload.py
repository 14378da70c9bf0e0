"""A PyTorch workload for the GPU suite, run unmodified natively and through ``crane run``.

cuBLAS matrix products (fp32 with TF32 off, fp16, bf16, batched, addmm), a cuDNN convolution
and a few training steps of a small MLP with Adam. Every input and the model's initial weights
come from seeded CPU generators, so both runs start from identical bytes; deterministic
algorithms are enforced.
Writes ``results.json`` (device identity, losses, optional step timings) and the results as
``.npy`` arrays into ``--out``; the test compares two such folders.

    python torch_workload.py --out DIR [--steps 8] [--bench-steps 0]

``--bench-steps N`` also times N training steps (after warm-up) of a small MLP (launch-bound)
and a large one (compute-bound), each step ending with ``loss.item()`` as training loops do.
"""

from __future__ import annotations

import os

# cuBLAS reads this when PyTorch creates its handle: fixed workspaces make its choices
# reproducible (required by torch.use_deterministic_algorithms for cuBLAS).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


def deterministic() -> None:
    torch.use_deterministic_algorithms(True, warn_only=True)  # a warning, not a failure
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False


def matmuls(dev: torch.device) -> dict[str, np.ndarray]:
    g = torch.Generator().manual_seed(1)
    a = torch.randn(1024, 768, generator=g)
    b = torch.randn(768, 512, generator=g)
    bias = torch.randn(512, generator=g)
    x = torch.randn(8, 128, 256, generator=g)
    y = torch.randn(8, 256, 64, generator=g)
    img = torch.randn(4, 16, 32, 32, generator=g)
    kern = torch.randn(32, 16, 3, 3, generator=g)
    da, db, dbias, dx, dy, dimg, dkern = (t.to(dev) for t in (a, b, bias, x, y, img, kern))
    out = {
        "fp32": da @ db,
        "fp32_tn": da.t().contiguous().t() @ db,  # a transposed operand: another cuBLAS path
        "fp16": (da.half() @ db.half()).float() if dev.type == "cuda" else da @ db,
        "bf16": (da.bfloat16() @ db.bfloat16()).float(),
        "bmm": torch.bmm(dx, dy),
        "addmm": torch.addmm(dbias, da, db),
        "chain": torch.tanh(da @ db) @ db.t(),  # product, elementwise kernel, product
        "conv2d": F.conv2d(dimg, dkern, padding=1),  # cuDNN (runs on sim:ptx-next too)
    }
    return {k: v.cpu().numpy() for k, v in out.items()}


def make_mlp(dev: torch.device, inp: int, hidden: int, classes: int) -> torch.nn.Module:
    torch.manual_seed(0)  # initial weights drawn on the CPU
    model = torch.nn.Sequential(
        torch.nn.Linear(inp, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, classes),
    )
    return model.to(dev)


def train(
    dev: torch.device, steps: int, inp: int = 256, hidden: int = 512, batch: int = 256
) -> tuple[list[float], np.ndarray]:
    classes = 10
    model = make_mlp(dev, inp, hidden, classes)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(2)
    xs = torch.randn(steps, batch, inp, generator=g)
    teacher = torch.randn(inp, classes, generator=g)  # learnable labels: the loss must fall
    ys = (xs @ teacher).argmax(-1)
    xs, ys = xs.to(dev), ys.to(dev)
    losses = []
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xs[s]), ys[s])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu().numpy()
    return losses, params


def time_steps(
    dev: torch.device, steps: int, inp: int, hidden: int, batch: int, warmup: int = 5
) -> dict[str, float]:
    classes = 10
    model = make_mlp(dev, inp, hidden, classes)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(batch, inp, generator=g).to(dev)
    y = torch.randint(0, classes, (batch,), generator=g).to(dev)
    times = []
    for i in range(warmup + steps):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()  # the step's end, as a training loop logging its loss sees it
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return {
        "median_ms": round(statistics.median(times) * 1e3, 4),
        "mean_ms": round(statistics.fmean(times) * 1e3, 4),
        "min_ms": round(min(times) * 1e3, 4),
        "steps": steps,
        "inp": inp,
        "hidden": hidden,
        "batch": batch,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--device", default="cuda", help="cuda (cpu: to check the script itself)")
    ap.add_argument("--bench-steps", type=int, default=0)
    ap.add_argument("--large", type=int, default=8192, help="hidden size = batch, large MLP")
    ap.add_argument("--skip-check", action="store_true", help="timings only")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    deterministic()
    dev = torch.device(a.device)
    res: dict = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        res.update(
            device=torch.cuda.get_device_name(0),
            capability=list(torch.cuda.get_device_capability(0)),
            total_memory=props.total_memory,
            multi_processor_count=props.multi_processor_count,
        )
    res["init_s"] = round(time.perf_counter() - t0, 3)
    if not a.skip_check:
        t = time.perf_counter()
        for name, arr in matmuls(dev).items():
            np.save(a.out / f"mm_{name}.npy", arr)
        losses, params = train(dev, a.steps)
        np.save(a.out / "mlp_params.npy", params)
        res["losses"] = losses
        res["check_s"] = round(time.perf_counter() - t, 3)
    if a.bench_steps:
        res["bench"] = {
            "small": time_steps(dev, a.bench_steps, inp=256, hidden=512, batch=256),
            "large": time_steps(
                dev, max(a.bench_steps // 2, 5), inp=2048, hidden=a.large, batch=a.large
            ),
        }
    res["total_s"] = round(time.perf_counter() - t0, 3)
    (a.out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "losses"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
