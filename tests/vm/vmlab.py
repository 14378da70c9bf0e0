"""The shared setting of the libvirt migration tests: two hosts, each a libvirtd (tests/vm/
libvirt_lab.py) and a craned on a different simulated GPU model, the libvirt hook installed on
both, and Crane guests (the vm-images image running a CUDA program under Crane's library)
started as transient domains.

A guest's serial log is followed on a thread that stamps each line as it appears on the host,
so a test can measure the program's visible pause (the largest gap between its progress ticks)
without trusting the guest's clock across a migration.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crane.craned.launcher import DaemonProcess
from crane.vm.domain import GUEST_ADDRESS, DomainSpec, domain_xml
from crane.vm.hook import HookConfig, hook_script
from crane.vm.migrate import attach_domain
from tests.vm.image import kernel_cmdline
from tests.vm.libvirt_lab import Libvirtd, two_hosts

__all__ = ["Guest", "Host", "Lab", "lab"]

#: The CUDA program's loop: iterations and the pause between them (ms).
ITERATIONS, DELAY_MS = 60, 150
MEMORY_MIB = 768
EXIT = re.compile(r"CRANE-VM-EXIT rc=(\d+)")


@dataclass
class Host:
    libvirt: Libvirtd
    daemon: DaemonProcess

    def conn(self) -> Any:
        import libvirt

        return libvirt.open(self.libvirt.uri)


#: A guest kernel's own report that it crashed (x86 oops, BUG, panic).
KERNEL_CRASH = re.compile(r"\] (Oops: |BUG: |Kernel panic - )")


class GuestCrashed(AssertionError):
    """The guest's kernel crashed: its program will never report an exit."""


@dataclass
class Guest:
    """A started domain and its serial log, followed with host timestamps."""

    name: str
    log: Path
    lines: list[tuple[float, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        pos, part = 0, ""
        while not self._stop.is_set():
            with contextlib.suppress(OSError), self.log.open("rb") as f:
                f.seek(pos)
                data = f.read()
                pos += len(data)
                part += data.decode(errors="replace")
                *done, part = part.split("\n")
                now = time.monotonic()
                self.lines += [(now, ln.rstrip("\r")) for ln in done]
            time.sleep(0.01)

    def text(self) -> str:
        return "\n".join(ln for _, ln in self.lines)

    def ticks(self) -> list[tuple[float, str]]:
        return [(t, ln) for t, ln in self.lines if ln.startswith("tick ")]

    def wait_for(self, pattern: str, timeout: float) -> None:
        """Until a console line matches ``pattern``; a guest kernel that crashed (an oops or
        a panic: nothing more will come) fails at once, saying so, not at the timeout."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while not any(rx.search(ln) for _, ln in self.lines):
            crash = next((ln for _, ln in self.lines if KERNEL_CRASH.search(ln)), None)
            if crash is not None:
                time.sleep(1)  # (the rest of the report)
                raise GuestCrashed(
                    f"{self.name}'s kernel crashed ({crash.strip()}) before {pattern!r}; "
                    f"its console:\n{self.text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no {pattern!r} in {self.name}'s console:\n{self.text()[-3000:]}"
                )
            time.sleep(0.05)

    def output(self, timeout: float = 240) -> list[str]:
        """The program's lines once the guest reported its exit (status 0 asserted)."""
        self.wait_for(EXIT.pattern, timeout)
        self._stop.set()
        m = EXIT.search(self.text())
        assert m is not None and m.group(1) == "0", self.text()[-3000:]
        out = self.text().split("CRANE-VM-READY", 1)[1].split("CRANE-VM-EXIT")[0]
        return [ln for ln in out.splitlines() if ln.strip()]

    def max_gap(self) -> float:
        t = [x for x, _ in self.ticks()]
        return max((b - a for a, b in itertools.pairwise(t)), default=0.0)


class Lab:
    def __init__(self, root: Path, a: Host, b: Host, image: Any) -> None:
        self.root, self.a, self.b, self.image = root, a, b, image
        self.n = 0

    def start(self, host: Host, program: bool = True) -> Guest:
        """A transient Crane guest on ``host`` running the CUDA loop (or, without ``program``,
        the same loop's cadence with no GPU work: the VM-only baseline)."""
        self.n += 1
        name = f"guest{self.n}"
        path, _ = attach_domain(host.daemon.address, name)
        if program:
            run = (
                f"/opt/crane/bin/crane-run /opt/crane/programs/migrate_loop {ITERATIONS} {DELAY_MS}"
            )
        else:
            run = (
                f"i=0; while [ $i -lt {ITERATIONS} ]; do echo tick $i; i=$((i+1)); "
                f"usleep {DELAY_MS * 1000} 2>/dev/null || sleep 0.{DELAY_MS:03d}; done"
            )
        log = self.root / f"{name}.serial"
        spec = DomainSpec(
            name=name,
            kernel=str(self.image.kernel),
            initrd=str(self.image.initrd),
            cmdline=kernel_cmdline(run, {"CRANE_DAEMON": GUEST_ADDRESS}),
            serial_log=str(log),
            crane_socket=path,
            crane_daemon=host.daemon.address,
            memory_mib=MEMORY_MIB,
        )
        conn = host.conn()
        try:
            conn.createXML(domain_xml(spec), 0)
        finally:
            conn.close()
        return Guest(name, log)


@contextlib.contextmanager
def lab(root: Path, image: Any) -> Iterator[Lab]:
    """Daemons first (the hooks name them), then the libvirtds with the hooks installed."""
    da = DaemonProcess(root / "craned-a", ["sim:a100-80gb"])
    # another GPU model (upwards: the guest, told the A100's limits, needs no acceptance)
    db = DaemonProcess(root / "craned-b", ["sim:h100-80gb"])
    try:
        hooks = [{"crane": hook_script(HookConfig(d.address))} for d in (da, db)]
        with two_hosts(root / "libvirt", hooks) as (la, lb):
            yield Lab(root, Host(la, da), Host(lb, db), image)
    finally:
        da.stop()
        db.stop()
