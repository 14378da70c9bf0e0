"""Two libvirtd instances on one machine, started by hand for the VM tests.

Why by hand: these machines run no systemd, and live migration needs two daemons that take each
other for different hosts. Each instance runs in its own mount and UTS namespace
(``unshare -m -u --propagation private``) with private bind mounts over ``/var``, ``/run`` and
``/etc/libvirt`` (and over ``/etc/passwd`` / ``/etc/group``, copies that add the
``libvirt-qemu`` user and group the QEMU driver resolves even when qemu.conf says root), a
distinct ``host_uuid`` (migration refuses equal ones) and no authentication on its unix socket.
Observed facts: ``shared/reference/vm-lab-facts.md``.

Paths QEMU must reach (kernel, initrd, serial logs, Crane's domain sockets) must therefore not lie
under ``/var`` or ``/run``: pytest's temporary directories (``/tmp``) are fine.

Hooks (``hooks/qemu.d/*``) are only picked up if present when libvirtd starts: pass them to
:class:`Libvirtd` up front. Teardown kills every QEMU the instance started (by the pid files
libvirt keeps in its private ``/run``), then libvirtd, even when the test failed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = ["Libvirtd", "lab_missing", "two_hosts"]

#: The binaries the lab needs (Debian: libvirt-daemon, libvirt-daemon-driver-qemu,
#: libvirt-clients, qemu-system-x86, socat).
NEEDS = ("libvirtd", "virsh", "qemu-system-x86_64", "socat", "unshare")

QEMU_CONF = """\
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
namespaces = [ ]
cgroup_controllers = [ ]
stdio_handler = "file"
# guestfwd=...-cmd:socat spawns a process: QEMU's seccomp sandbox (spawn=deny) kills QEMU
seccomp_sandbox = 0
"""


def lab_missing() -> str:
    """Why the lab cannot run here ("" when it can)."""
    missing = [b for b in NEEDS if shutil.which(b) is None]
    if missing:
        return f"needs {', '.join(missing)} (qemu-system-x86, libvirt-daemon, socat)"
    if os.geteuid() != 0:
        return "needs root (libvirtd in private mount namespaces)"
    try:
        import libvirt  # noqa: F401
    except ImportError:
        return "needs libvirt-python (pip install libvirt-python)"
    return ""


class Libvirtd:
    """One libvirtd in its own namespaces under ``root``; :attr:`uri` reaches it."""

    def __init__(self, root: Path, name: str, hooks: dict[str, str] | None = None) -> None:
        self.root = root
        self.name = name
        self.var, self.run, self.etc = root / "var", root / "run", root / "etc-libvirt"
        for d in (self.var / "lib/libvirt", self.var / "log/libvirt", self.var / "cache", self.run):
            d.mkdir(parents=True, exist_ok=True)
        (self.etc / "hooks/qemu.d").mkdir(parents=True, exist_ok=True)
        for hook, text in (hooks or {}).items():
            path = self.etc / "hooks/qemu.d" / hook
            path.write_text(text)
            path.chmod(0o755)
        self.log = root / "libvirtd.log"
        (self.etc / "libvirtd.conf").write_text(
            f'host_uuid = "{uuid.uuid4()}"\n'
            'auth_unix_ro = "none"\nauth_unix_rw = "none"\n'
            'unix_sock_group = "root"\nunix_sock_rw_perms = "0700"\n'
            f'log_outputs = "2:file:{self.log}"\n'
        )
        (self.etc / "qemu.conf").write_text(QEMU_CONF)
        (self.etc / "libvirt.conf").write_text("")
        for f in ("passwd", "group"):
            text = Path("/etc", f).read_text()
            line = "libvirt-qemu:x:64055:64055::/var/lib/libvirt:/usr/sbin/nologin\n"
            if f == "group":
                line = "libvirt-qemu:x:64055:\n"
            if "\nlibvirt-qemu:" not in "\n" + text:
                text += ("" if text.endswith("\n") else "\n") + line
            (root / f).write_text(text)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.run / "libvirt/libvirt-sock"

    @property
    def uri(self) -> str:
        return f"qemu+unix:///system?socket={self.socket}"

    def start(self, timeout: float = 60.0) -> None:
        binds = [
            (self.var, "/var"),
            (self.run, "/run"),
            (self.etc, "/etc/libvirt"),
            (self.root / "passwd", "/etc/passwd"),
            (self.root / "group", "/etc/group"),
        ]
        script = " && ".join(
            [f"mount --bind {src} {dst}" for src, dst in binds]
            + [f"hostname {self.name}", "exec libvirtd -f /etc/libvirt/libvirtd.conf"]
        )
        out = (self.root / "libvirtd.out").open("wb")
        self.proc = subprocess.Popen(
            ["unshare", "-m", "-u", "--propagation", "private", "sh", "-c", script],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"libvirtd {self.name} exited: {self.tail()}")
            if self.socket.exists() and self._answers():
                return
            time.sleep(0.1)
        raise RuntimeError(f"libvirtd {self.name} did not come up in {timeout:g} s: {self.tail()}")

    def _answers(self) -> bool:
        import libvirt

        try:
            conn = libvirt.open(self.uri)
        except libvirt.libvirtError:
            return False
        conn.close()
        return True

    def tail(self, n: int = 2000) -> str:
        text = ""
        for f in (self.root / "libvirtd.out", self.log):
            with contextlib.suppress(OSError):
                text += f.read_text(errors="replace")[-n:]
        return text

    def qemu_pids(self) -> list[int]:
        pids = []
        for f in (self.run / "libvirt/qemu").glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                pids.append(int(f.read_text().strip()))
        return pids

    def stop(self) -> None:
        """Kill its QEMUs and libvirtd itself (namespaces go with their last process)."""
        for pid in self.qemu_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        for pid in self.qemu_pids():  # one started while libvirtd went down
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def two_hosts(
    root: Path, hooks: list[dict[str, str]] | None = None
) -> Iterator[tuple[Libvirtd, ...]]:
    """Hosts ``a`` and ``b``, each its own libvirtd (with its ``hooks``: name -> script),
    torn down on exit."""
    hooks = hooks or [{}, {}]
    hosts = [Libvirtd(root / n, f"crane-lab-{n}", h) for n, h in zip("ab", hooks, strict=True)]
    try:
        for h in hosts:
            h.start()
        yield tuple(hosts)
    finally:
        for h in hosts:
            h.stop()
