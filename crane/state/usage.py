"""What a session *uses* of its device, collected from its worker-side state for a pre-flight.

Why from the loaded functions and launch peaks rather than from the guest: the worker never
trusts the guest, and it already holds every loaded kernel's compiled needs (static shared
memory, registers, compiled cluster sizes) and every validated launch's peak
(:attr:`~crane.engine.model.SessionDevice.launch_peaks`). One pass over the loaded functions,
cheap enough to run at every pre-flight; the result (:class:`~crane.state.preflight.Use`)
travels in the peer pre-flight request and in a checkpoint's META.
"""

from __future__ import annotations

from crane.engine.model import SessionDevice
from crane.state.preflight import Use

__all__ = ["use_of"]


def use_of(dev: SessionDevice) -> Use:
    """The session's need: the largest of each quantity over its loaded functions."""
    shared = threads = regs = cluster = 0
    cooperative = False
    shared_by = ""
    for h in dev.functions:
        fn = dev.functions.get(h)
        kernel = dev.modules.get(fn.meta).obj.image.kernels[fn.obj]
        dyn, launched_threads, ctas, coop = dev.launch_peaks.get(h, [0, 0, 0, 0])
        configured = dev.max_dynamic_shared.get(h, 0)
        need = (kernel.static_shared_bytes or 0) + max(dyn, configured)
        if need > shared:
            shared, shared_by = need, fn.obj
        threads = max(threads, launched_threads)
        if kernel.num_regs:
            regs = max(regs, kernel.num_regs * launched_threads)
        compiled = kernel.cluster_dims
        ctas_compiled = compiled[0] * compiled[1] * compiled[2] if compiled else 0
        cluster = max(cluster, ctas, ctas_compiled)
        cooperative = cooperative or bool(coop)
    return Use(
        shared_per_block=shared,
        threads_per_block=threads,
        registers_per_block=regs,
        cluster_size=cluster,
        cooperative=cooperative,
        shared_by=shared_by,
    )
