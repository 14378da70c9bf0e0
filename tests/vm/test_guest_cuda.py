"""A CUDA program in a QEMU TCG guest, against a host craned on the simulated GPU.

The guest (vm-images/) dials ``vm://10.0.2.100:7000``; QEMU's guest forward takes the
connection to the domain socket craned serves for it (``--domain``), which is how the host, not
the guest, says which VM a session belongs to. The same binary run on the host under
``crane run`` gives the output the guest's must equal line for line.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from crane.craned.launcher import DaemonProcess
from tests.vm.image import FORWARD_IP, Booted, loop_output, tick_times

pytestmark = pytest.mark.vm

DOMAIN = "vmtest"
PORT = 7000
ITERATIONS = "4"


@pytest.fixture
def domain_daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    """craned on the simulated GPU serving the domain socket of ``DOMAIN``."""
    with DaemonProcess(tmp_path / "run", ["sim:h100-80gb"], extra_args=["--domain", DOMAIN]) as d:
        yield d


def test_cuda_program_in_guest_matches_host_run(
    vm_image: Any, domain_daemon: DaemonProcess, boot_vm: Callable[..., Booted]
) -> None:
    try:
        guest_path = vm_image.program("migrate_loop")
    except KeyError:
        pytest.skip("the guest image holds no CUDA programs: it was built without nvcc")
    sock = domain_daemon.run_dir / "domains" / f"{DOMAIN}.sock"
    start = time.monotonic()
    env = {"CRANE_DAEMON": f"vm://{FORWARD_IP}:{PORT}", "MIGRATE_LOOP_TIMES": "1"}
    guest = boot_vm(f"crane-run {guest_path} {ITERATIONS}", env=env, forwards={PORT: sock})
    rc, console = guest.wait(timeout=240)
    elapsed = time.monotonic() - start
    in_guest = loop_output(console)
    assert rc == 0, console[-3000:]
    assert in_guest[-1] == "PASSED" and len(in_guest) == int(ITERATIONS) + 3, console[-3000:]
    times = tick_times(console)
    assert len(times) == int(ITERATIONS) and times == sorted(times), console[-3000:]

    host = subprocess.run(
        [sys.executable, "-m", "crane.cli.main", "run", "--daemon", domain_daemon.address, "--",
         str(vm_image.host_program("migrate_loop")), ITERATIONS],
        capture_output=True, text=True, timeout=240,
        env={k: v for k, v in os.environ.items() if k != "CRANE_TRACE"},
    )  # fmt: skip
    assert host.returncode == 0, host.stderr[-3000:]
    assert in_guest == loop_output(host.stdout)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    print(f"guest boot + {ITERATIONS} iterations + power-off: {elapsed:.1f} s; "
          f"tick gaps {', '.join(f'{g:.0f}' for g in gaps)} ms")  # fmt: skip
