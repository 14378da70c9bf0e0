"""A guest workload shared by the checkpoint and migration tests: state with device pointers
stored inside device memory, a `__device__` counter, streams and events, and steps that each
depend on the last, so a wrong restore or a lost or repeated call changes the result."""

from __future__ import annotations

import numpy as np

from crane.guest.session import GuestSession

N = 4096

SRC = r"""
__device__ unsigned int steps_done;
extern "C" __global__ void step(float **table, int n)
{
    float *x = table[0], *y = table[1];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * 0.5f + x[i] * 1.25f + (float)(i & 7);
    if (i == 0) atomicAdd(&steps_done, 1u);
}
extern "C" __global__ void mix(float *x, const float *y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] - y[(i * 7) % n] * 0.125f;
}
"""


class Workload:
    """The guest side: state built once, then steps that each depend on the last."""

    def __init__(self, s: GuestSession, image: bytes) -> None:
        self.s = s
        rng = np.random.default_rng(7)
        self.x = s.mem_alloc(N * 4)
        self.y = s.mem_alloc(N * 4)
        self.table = s.mem_alloc(16)
        s.memcpy_htod(self.x, rng.standard_normal(N).astype(np.float32).tobytes())
        s.memcpy_htod(self.y, rng.standard_normal(N).astype(np.float32).tobytes())
        s.memcpy_htod(self.table, np.array([self.x, self.y], dtype=np.uint64).tobytes())
        self.stream = s.stream_create()
        self.ev0, self.ev1 = s.event_create(), s.event_create()
        self.mod = s.module_load(image)
        self.step_fn = s.module_get_function(self.mod, "step")
        self.mix_fn = s.module_get_function(self.mod, "mix")

    def run(self, steps: int) -> None:
        s = self.s
        for _ in range(steps):
            s.event_record(self.ev0, self.stream)
            s.launch(
                self.step_fn,
                grid=(N // 256,),
                block=(256,),
                params=[self.table, N],
                stream=self.stream,
            )
            s.launch(
                self.mix_fn,
                grid=(N // 256,),
                block=(256,),
                params=[self.x, self.y, N],
                stream=self.stream,
            )
            s.event_record(self.ev1, self.stream)
            s.event_synchronize(self.ev1)

    def result(self) -> tuple[bytes, bytes, int]:
        s = self.s
        s.synchronize()
        addr, _ = self.mod.globals["steps_done"]
        count = int.from_bytes(s.memcpy_dtoh(addr, 4), "little")
        return s.memcpy_dtoh(self.x, N * 4), s.memcpy_dtoh(self.y, N * 4), count


def reference(address: str, image: bytes, steps: int) -> tuple[bytes, bytes, int]:
    """The unmoved result of ``steps`` steps, computed on a session of its own."""
    with GuestSession(address, client="reference") as s:
        w = Workload(s, image)
        w.run(steps)
        return w.result()
