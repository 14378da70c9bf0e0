"""A guest whose kernel never returns, in a process of its own (the watchdog tests kill it).

The kernel spins on a flag in device memory that nothing ever sets (a volatile load, so no
compiler or interpreter may hoist it), like a kernel waiting on a producer that died.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from crane.craned.launcher import DaemonProcess

SPIN_PTX = r"""
.version 7.0
.target sm_80
.address_size 64

.visible .entry spin(.param .u64 flag)
{
    .reg .pred %p<2>;
    .reg .b32 %r<2>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [flag];
    cvta.to.global.u64 %rd2, %rd1;
LOOP:
    ld.volatile.global.u32 %r1, [%rd2];
    setp.eq.s32 %p1, %r1, 0;
    @%p1 bra LOOP;
    ret;
}
"""


#: A kernel that keeps reading and writing device memory for minutes over many blocks (every
#: core's share of the grid busy in memory when the guest dies)
BUSY_PTX = r"""
.version 7.0
.target sm_80
.address_size 64

.visible .entry spin(.param .u64 buf)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .f32 %f<3>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [buf];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mad.lo.s32 %r1, %r2, 128, %r1;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    mov.u32 %r3, 0;
LOOP:
    ld.global.f32 %f1, [%rd4];
    fma.rn.f32 %f2, %f1, 0f3F7FBE77, 0f3F800000;
    st.global.f32 [%rd4], %f2;
    add.s32 %r3, %r3, 1;
    setp.lt.u32 %p1, %r3, 2000000000;
    @%p1 bra LOOP;
    ret;
}
"""


def start_stuck_guest(
    daemon: DaemonProcess, path: str, busy: bool = False
) -> tuple[subprocess.Popen, str, int]:
    """A guest process inside a kernel that never returns, its calls on ``path`` ("ring",
    "direct": the worker's gRPC socket, "relay"): the process, its session id and its
    worker's pid (from the daemon's log). ``busy``: the kernel works on memory over 512
    blocks (:data:`BUSY_PTX`) instead of one warp spinning on a flag."""
    image = (BUSY_PTX if busy else SPIN_PTX).encode() + b"\0"
    grid = 512 if busy else 1
    direct = path != "relay"
    env = dict(os.environ, CRANE_RING="require" if path == "ring" else "0")
    script = textwrap.dedent(f"""
        import sys
        from crane.guest.session import GuestSession
        s = GuestSession({daemon.address!r}, client="stuck", direct={direct!r})
        assert s._t.path == {path!r}, s._t.path
        flag = s.mem_alloc(4 << 17)
        s.memset_d32(flag, 0, 1 << 17)
        fn = s.module_get_function(s.module_load({image!r}), "spin")
        s.synchronize()
        s.launch(fn, grid=({grid},), block=({128 if busy else 32},), params=[flag])
        s._t.flush()
        print(s.session_id, flush=True)
        s.synchronize()  # never returns
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    sid = proc.stdout.readline().strip()
    assert sid, f"the stuck guest did not start (exit {proc.poll()})"
    pid = int(
        daemon.log_text().split(f"session {sid} opened")[1].split("worker pid ")[1].split()[0]
    )
    return proc, sid, pid
