"""JAX on a real GPU, unmodified: ``jit`` of a small MLP's training step (SGD), ten steps on
the GPU and the same ten on JAX's CPU backend from the same initial weights; the losses must
agree within float tolerance. Prints ``losses ok`` (or ``losses FAIL`` with both curves) and
exits 1 on a mismatch. Preallocation is off so the GPU's memory is taken as needed."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import numpy as np

rng = np.random.default_rng(3)
X = rng.standard_normal((256, 64)).astype(np.float32)
Y = rng.standard_normal((256, 8)).astype(np.float32)
W0 = [rng.standard_normal(s).astype(np.float32) * 0.1 for s in ((64, 128), (128,), (128, 8), (8,))]


def loss(p, x, y):  # type: ignore[no-untyped-def]
    h = jnp.tanh(x @ p[0] + p[1])
    return jnp.mean((h @ p[2] + p[3] - y) ** 2)


@jax.jit
def step(p, x, y):  # type: ignore[no-untyped-def]
    lv, g = jax.value_and_grad(loss)(p, x, y)
    return [w - 0.05 * gw for w, gw in zip(p, g, strict=True)], lv


def run(device) -> list[float]:  # type: ignore[no-untyped-def]
    p = [jax.device_put(w, device) for w in W0]
    x, y = jax.device_put(X, device), jax.device_put(Y, device)
    out = []
    for _ in range(10):
        p, lv = step(p, x, y)
        out.append(float(lv))
    return out


gpu = jax.devices("gpu")[0]
print("device", gpu.device_kind, flush=True)
try:
    on_gpu = run(gpu)
except Exception as e:  # the first lines say why; XLA's own log is long
    print("error", str(e)[:2000], flush=True)
    sys.exit(1)
on_cpu = run(jax.devices("cpu")[0])
ok = np.allclose(on_gpu, on_cpu, rtol=1e-4, atol=1e-6)
print("losses", "ok" if ok else f"FAIL gpu={on_gpu} cpu={on_cpu}", flush=True)
sys.exit(0 if ok else 1)
