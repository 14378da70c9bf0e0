"""The migration part of ``crane demo``: a real CUDA program moved between daemons mid-run.

An nvcc-built program (static cudart, run with ``crane run``) iterates a computation whose every
step depends on the last; while it runs, ``crane migrate`` moves its session from the demo's
daemon (H100 profile) up to a second daemon (H200 profile), then down to a third (A100 80GB):
the pre-flight first refuses that downward move, listing what the program was told at start
and the A100 offers less of, and the operator accepts it (``--accept-lower-limits``: the
program uses none of it). The program never notices; its final checksum is compared with the
same computation done by NumPy.

Run with ``--gate`` the program stops half-way and waits for a line on its standard input
before its second half: the demo sends it once both moves are done, so the moves happen while
the program still has work to do on a machine of any speed (the CLI's three calls take
seconds on a loaded 2-core machine, and the program once finished before the last move).
Without the argument (the tests' runs) it runs straight through.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from crane.craned.launcher import DaemonProcess

__all__ = ["ITERATIVE_PROGRAM", "demo_migration", "reference_checksum"]

N, STEPS = 4096, 600

ITERATIVE_PROGRAM = r"""
#include <cstdio>
#include <cstring>
#include <unistd.h>
__global__ void step(const unsigned *a, unsigned *b, int n, unsigned k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned l = a[(i + n - 1) % n], r = a[(i + 1) % n];
        b[i] = l + 3u * a[i] + r + k;
    }
}
int main(int argc, char **argv) {
    const int n = NN, steps = SS;
    bool gate = argc > 1 && strcmp(argv[1], "--gate") == 0;
    unsigned *h = new unsigned[n], *a, *b;
    for (int i = 0; i < n; ++i) h[i] = i * 2654435761u;
    cudaMalloc(&a, n * sizeof(unsigned));
    cudaMalloc(&b, n * sizeof(unsigned));
    cudaMemcpy(a, h, n * sizeof(unsigned), cudaMemcpyHostToDevice);
    for (int s = 0; s < steps; ++s) {
        step<<<(n + 255) / 256, 256>>>(a, b, n, s);
        unsigned *t = a; a = b; b = t;
        cudaDeviceSynchronize();
        if (s % 50 == 0) { printf("step %d\n", s); fflush(stdout); }
        if (gate && s == steps / 2) {  // the demo's moves are done when a line comes
            for (int c = getchar(); c != EOF && c != '\n'; c = getchar()) {}
        }
        usleep(10000);  // ~6 s in all
    }
    cudaMemcpy(h, a, n * sizeof(unsigned), cudaMemcpyDeviceToHost);
    unsigned long long sum = 0;
    for (int i = 0; i < n; ++i) sum = sum * 31 + h[i];
    printf("checksum %llu (%s)\n", sum, cudaGetErrorString(cudaGetLastError()));
    return 0;
}
""".replace("NN", str(N)).replace("SS", str(STEPS))


def reference_checksum() -> int:
    """The program's result, computed by NumPy with the same wrap-around arithmetic."""
    a = (np.arange(N, dtype=np.uint64) * 2654435761) & 0xFFFFFFFF
    a = a.astype(np.uint32)
    for s in range(STEPS):
        a = np.roll(a, 1) + np.uint32(3) * a + np.roll(a, -1) + np.uint32(s)
    total = 0
    for v in a.tolist():
        total = (total * 31 + v) & 0xFFFFFFFFFFFFFFFF
    return total


def _crane(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crane.cli.main", *args], capture_output=True, text=True, timeout=300
    )


def demo_migration(address: str, tmpdir: Path, nvcc: str, say) -> int:  # type: ignore[no-untyped-def]
    src = tmpdir / "iterate.cu"
    src.write_text(ITERATIVE_PROGRAM)
    exe = tmpdir / "iterate"
    subprocess.run([nvcc, "-o", str(exe), str(src)], check=True, capture_output=True)
    with (
        DaemonProcess(tmpdir / "run-b", ["sim:h200"]) as dest,
        DaemonProcess(tmpdir / "run-c", ["sim:a100-80gb"]) as down,
    ):
        say(f"live migration: a second craned (sim:h200) at {dest.address}")
        say(f"               a third craned (sim:a100-80gb) at {down.address}")
        run = [sys.executable, "-m", "crane.cli.main", "run", "--daemon", address, "--"]
        prog = subprocess.Popen(
            [*run, str(exe), "--gate"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert prog.stdout is not None
        first = prog.stdout.readline().strip()  # "step 0": the program is running
        say(f"  [guest] {first}")
        sessions = json.loads(_crane("--daemon", address, "ps", "--json").stdout)["sessions"]
        sid = next(s["id"] for s in sessions if "iterate" in s.get("client", ""))
        time.sleep(0.3)
        moved = _crane("--daemon", address, "migrate", "--session", sid, "--to", dest.address)
        say(f"  crane migrate (H100 -> H200): {_said(moved)}")
        there = json.loads(_crane("--daemon", dest.address, "ps", "--json").stdout)["sessions"]
        say(f"  crane ps on the destination: {[(s['id'], s['state']) for s in there]}")
        argv = ("--daemon", dest.address, "migrate", "--session", sid, "--to", down.address)
        refused = _crane(*argv)
        say(f"  crane migrate (H200 -> A100): {_said(refused)}")
        accepted = _crane(*argv, "--accept-lower-limits")
        say(f"  crane migrate (H200 -> A100) --accept-lower-limits: {_said(accepted)}")
        out, err = prog.communicate("\n", timeout=300)  # the second half, on the A100
        for line in out.splitlines():
            say(f"  [guest] {line}")
        want = reference_checksum()
        ok = (
            prog.returncode == 0
            and moved.returncode == 0
            and refused.returncode != 0
            and accepted.returncode == 0
            and f"checksum {want} " in out
        )
        say(f"  result after the moves: {'matches NumPy' if ok else 'WRONG: ' + err[-500:]}")
        return 0 if ok else 1


def _said(p: subprocess.CompletedProcess[str]) -> str:
    """What a crane command printed, on one line (its refusal when it failed)."""
    text = (p.stdout.strip() or p.stderr.strip()).replace("\n", " ")
    return text if p.returncode == 0 else f"refused: {text}"
