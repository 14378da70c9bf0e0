"""Crane's test guest for the ``vm`` tests: the image (vm-images/build.py, cached by content)
and a QEMU TCG boot of it with user networking whose guest forwards reach host unix sockets.

For tests that boot under libvirt, :func:`kernel_cmdline` gives the ``<cmdline>`` and
``Image.kernel``/``Image.initrd`` the ``<kernel>``/``<initrd>`` of a direct-kernel-boot domain.

The guest's /init (vm-images/init.sh) runs ``crane.run`` with ``crane.env`` variables, prints
``CRANE-VM-READY`` before and ``CRANE-VM-EXIT rc=N`` after it, then powers off.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "vm-images" / "build.py"

READY = "CRANE-VM-READY"
EXIT_RE = re.compile(r"CRANE-VM-EXIT rc=(\d+)")
#: QEMU user networking's guest side: the guest's address, gateway, and where forwards live.
GUEST_IP = "10.0.2.15"
FORWARD_IP = "10.0.2.100"
QEMU = "qemu-system-x86_64"
#: TCG's default CPU (qemu64) lacks SSE4.2/POPCNT, which NumPy 2's wheels require (x86-64-v2):
#: ``max`` is every feature TCG emulates (libvirt: ``<cpu mode='maximum'/>``).
CPU = "max"
#: Host tools a QEMU-booted guest test needs: QEMU, socat (the forward's host end), and what
#: builds the image (apt-get download, dpkg-deb -x).
TOOLS = (QEMU, "socat", "apt-get", "apt-cache", "dpkg-deb")


def missing_tools(tools: Sequence[str] = TOOLS) -> list[str]:
    """The host tools of ``tools`` that are not on PATH."""
    return [t for t in tools if shutil.which(t) is None]


def _build_module() -> ModuleType:
    """vm-images/build.py as a module (a directory of scripts, not a package: loaded by path
    and registered, since its dataclasses look their module up in ``sys.modules``)."""
    name = "crane_vm_images_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BUILD)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def ensure_image(rebuild: bool = False) -> Any:
    """The current guest image (``build.Image``: ``.kernel``, ``.initrd``, ``.key``,
    ``.manifest``), built first when the cache has none for its content key."""
    return _build_module().ensure(rebuild=rebuild)


def _quote(value: str, what: str) -> str:
    if '"' in value or "\n" in value:
        raise ValueError(f"{what} cannot hold a double quote or a newline: {value!r}")
    return f'"{value}"'


def kernel_cmdline(run: str | None = None, env: Mapping[str, str] | None = None,
                   keep: bool = False, extra: str = "") -> str:  # fmt: skip
    """The kernel command line that makes the guest run ``run`` (a shell command line) with
    ``env`` and power off when it ends (``keep``: stay up after it)."""
    parts = ["console=ttyS0", "panic=-1", "quiet"]
    if run is not None:
        parts.append("crane.run=" + _quote(run, "crane.run"))
    for name, value in (env or {}).items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"bad environment variable name {name!r}")
        parts.append("crane.env=" + _quote(f"{name}={value}", "crane.env"))
    if keep:
        parts.append("crane.keep=1")
    if extra:
        parts.append(extra)
    return " ".join(parts)


def guestfwd(guest_port: int, unix_socket: Path, guest_ip: str = FORWARD_IP) -> str:
    """A ``-netdev user`` guestfwd: the guest's TCP ``guest_ip:guest_port`` reaches the host's
    unix socket (a socat per connection, started by QEMU)."""
    path = str(unix_socket)
    if any(c in path for c in ", \t"):
        raise ValueError(f"socket path unusable in a QEMU option: {path!r}")
    return f"guestfwd=tcp:{guest_ip}:{guest_port}-cmd:socat - UNIX-CONNECT:{path}"


def qemu_args(image: Any, cmdline: str, serial_log: Path, forwards: Mapping[int, Path] = {},
              memory_mb: int = 512, extra: Sequence[str] = ()) -> list[str]:  # fmt: skip
    """The QEMU command line for ``image`` under TCG, one CPU, user networking with
    ``forwards`` (guest port on 10.0.2.100 -> host unix socket), serial console to a file."""
    netdev = ",".join(["user,id=n0,restrict=on", *(guestfwd(p, s) for p, s in forwards.items())])
    return [
        QEMU, "-accel", "tcg", "-cpu", CPU, "-m", str(memory_mb), "-smp", "1",
        "-kernel", str(image.kernel), "-initrd", str(image.initrd), "-append", cmdline,
        "-display", "none", "-no-reboot", "-nodefaults", "-serial", f"file:{serial_log}",
        "-netdev", netdev, "-device", "virtio-net-pci,netdev=n0", *extra,
    ]  # fmt: skip


@dataclass
class Booted:
    """A running guest: its QEMU process and serial log."""

    proc: subprocess.Popen[bytes]
    serial_log: Path
    started: float = field(default_factory=time.monotonic)

    def output(self) -> str:
        try:
            return self.serial_log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for(self, pattern: str, timeout: float) -> str:
        """The serial output once it holds ``pattern`` (a regex); raises TimeoutError naming
        the output so far when it does not appear, or when QEMU ends first."""
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while True:
            text = self.output()
            if rx.search(text):
                return text
            if self.proc.poll() is not None:
                raise TimeoutError(f"QEMU exited ({self.proc.returncode}) before {pattern!r}:\n"
                                   f"{text[-4000:]}")  # fmt: skip
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {pattern!r} after {timeout:.0f} s:\n{text[-4000:]}")
            time.sleep(0.05)

    def wait(self, timeout: float) -> tuple[int, str]:
        """Wait for the guest to power off: (the command's exit status, the serial output)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(f"guest still running after {timeout:.0f} s:\n"
                               f"{self.output()[-4000:]}") from None  # fmt: skip
        text = self.output()
        m = EXIT_RE.search(text)
        if m is None:
            raise RuntimeError(f"guest ended (QEMU {self.proc.returncode}) without an exit "
                               f"marker:\n{text[-4000:]}")  # fmt: skip
        return int(m.group(1)), text

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def boot(image: Any, serial_log: Path, run: str | None = None,
         env: Mapping[str, str] | None = None, forwards: Mapping[int, Path] = {},
         memory_mb: int = 512, extra: Sequence[str] = ()) -> Booted:  # fmt: skip
    """Start ``image`` under QEMU TCG running ``run``; the caller waits (:meth:`Booted.wait`)
    and kills it when done (:meth:`Booted.kill`)."""
    serial_log.unlink(missing_ok=True)
    args = qemu_args(image, kernel_cmdline(run, env), serial_log, forwards, memory_mb, extra)
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)  # fmt: skip
    return Booted(proc, serial_log)
