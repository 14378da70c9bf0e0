"""``crane doctor --host``: can this machine run craned as configured?

Checks, in the order a failure further down depends on: the configuration file (craned's own
loader, so it is refused exactly as craned would refuse it); the NVIDIA driver, NVML, cuda-python,
the GPUs the configuration names, and whether the driver reserves the workers' device-VA windows
at their addresses (only where the configuration wants a GPU; a simulated-only host is told so
plainly); the run directory and the sockets' permissions; the TLS files; the libvirt hook (where
libvirt or domains are configured); and whether the daemon answers its health check.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from crane.cli.doctor_certs import check_tls_files
from crane.cli.doctor_findings import FAIL, OK, SKIP, WARN, Finding
from crane.craned.config import DaemonConfig, load_config
from crane.wire.address import to_grpc_target

__all__ = ["DEFAULT_CONFIG", "HOOKS_DIR", "host_findings", "wants_gpu"]

DEFAULT_CONFIG = "/etc/crane/craned.toml"
HOOKS_DIR = "/etc/libvirt/hooks"
_DRIVER_VERSION = Path("/proc/driver/nvidia/version")
_INSTALL_HOST = "pip install 'crane[host]'"


def wants_gpu(cfg: DaemonConfig) -> bool | None:
    """True: a backend names a GPU (``cuda``); None: ``auto`` (a GPU if there is one);
    False: simulated devices only."""
    specs = [b.split("@", 1)[0] for b in cfg.backend]
    if any(s == "cuda" or s.startswith("cuda:") for s in specs):
        return True
    if any(s == "auto" for s in specs):
        return None
    return False


def _config(path: str | None) -> tuple[DaemonConfig | None, Finding]:
    name = "config"
    if path is None and Path(DEFAULT_CONFIG).exists():
        path = DEFAULT_CONFIG
    if path is None:
        return load_config(None, {}), Finding(
            name,
            WARN,
            f"no {DEFAULT_CONFIG}: checking craned's defaults",
            f"copy packaging/craned.toml to {DEFAULT_CONFIG} and edit it, or pass --config FILE",
        )
    try:
        cfg = load_config(path, {})
    except FileNotFoundError:
        return None, Finding(
            name, FAIL, f"{path} does not exist", "create it (example: packaging/craned.toml)"
        )
    except (OSError, ValueError) as e:
        return None, Finding(
            name,
            FAIL,
            f"{path}: {e}",
            f"edit {path} (the keys are documented in crane/craned/config.py), then `craned "
            f"--config {path}` to try it",
        )
    return cfg, Finding(
        name, OK, f"{path} is valid ({', '.join(cfg.backend)} on {', '.join(cfg.listen)})"
    )


def _gpu_findings(cfg: DaemonConfig) -> list[Finding]:
    gpu = wants_gpu(cfg)
    if gpu is False:
        return [
            Finding(
                "gpu",
                SKIP,
                f"the configuration serves simulated devices only ({', '.join(cfg.backend)}): "
                "no GPU needed",
            )
        ]
    miss = FAIL if gpu else WARN  # auto: falls back to the simulator, which may be intended
    out: list[Finding] = []
    if not _DRIVER_VERSION.exists():
        return [
            Finding(
                "nvidia driver",
                miss,
                "no NVIDIA kernel driver is loaded on this machine (no /proc/driver/nvidia/version)"
                + ("" if gpu else "; backend auto will use the simulated GPU"),
                "install the NVIDIA driver (e.g. `apt install nvidia-driver`) and load it: "
                "`modprobe nvidia`",
            )
        ]
    first = _DRIVER_VERSION.read_text(errors="replace").splitlines()[0:1]
    out.append(Finding("nvidia driver", OK, first[0].strip() if first else "loaded"))
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        out.append(Finding("nvml", miss, "pynvml (nvidia-ml-py) is not installed", _INSTALL_HOST))
    else:
        try:
            pynvml.nvmlInit()
            version = pynvml.nvmlSystemGetDriverVersion()
            count = pynvml.nvmlDeviceGetCount()
            out.append(Finding("nvml", OK, f"driver {version!s}, {count} GPU(s)"))
        except pynvml.NVMLError as e:
            out.append(
                Finding(
                    "nvml",
                    miss,
                    f"NVML cannot initialize: {e}",
                    "`nvidia-smi` shows why; reinstall or reload the driver (`modprobe -r "
                    "nvidia && modprobe nvidia`)",
                )
            )
    try:
        from cuda.bindings import driver as drv  # type: ignore[import-not-found]
    except ImportError as e:
        out.append(
            Finding("cuda-python", miss, f"cuda-python cannot be imported: {e}", _INSTALL_HOST)
        )
        return out
    err, *_ = drv.cuInit(0)
    if int(err) != 0:
        out.append(
            Finding(
                "cuda-python",
                miss,
                f"cuInit failed: {err!r}",
                "check `nvidia-smi`; the user running craned needs access to /dev/nvidia*",
            )
        )
        return out
    err, count = drv.cuDeviceGetCount()
    out.append(Finding("cuda-python", OK, f"cuInit ok, {count} CUDA device(s)"))
    ordinals = []
    for spec in cfg.backend:
        s = spec.split("@", 1)[0]
        if s.startswith("cuda:") and s[5:].isdigit():
            ordinals.append(int(s[5:]))
        elif s in ("cuda", "auto"):
            ordinals.append(0)
    missing = [o for o in ordinals if o >= count]
    if missing:
        out.append(
            Finding(
                "gpus visible",
                miss,
                f"the configuration names cuda:{missing[0]} but CUDA sees {count} device(s)",
                "check `nvidia-smi -L` and CUDA_VISIBLE_DEVICES in craned's environment, or "
                "fix `backend`",
            )
        )
        return out
    out.append(Finding("gpus visible", OK, f"configured GPU(s) {sorted(set(ordinals))} present"))
    for o in sorted(set(ordinals)):
        out.append(_vmm(o, miss))
    return out


def _vmm(ordinal: int, miss: str) -> Finding:
    name = f"vmm window (cuda:{ordinal})"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "crane.cli.doctor_vmm", str(ordinal)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as e:
        return Finding(
            name,
            miss,
            f"the reservation probe gave no answer: {e}",
            "run `python -m crane.cli.doctor_vmm N` to see its output",
        )
    if answer.get("ok"):
        return Finding(
            name,
            OK,
            "cuMemAddressReserve places the session windows where asked (granularity "
            f"{answer['granularity']:#x})",
        )
    return Finding(
        name,
        FAIL,
        f"cuMemAddressReserve: {answer.get('error')}",
        "a driver with the virtual memory management API (CUDA 10.2+), and nothing mapped at "
        "0x1000_0000_0000-0x4000_0000_0000 in craned's workers (see README, Limits)",
    )


def _mode(path: Path) -> str:
    return stat.filemode(path.stat().st_mode)


def _dir_finding(check: str, d: Path, purpose: str) -> Finding:
    if not d.exists():
        return Finding(
            check,
            WARN,
            f"{d} does not exist ({purpose}; craned creates it)",
            f"start craned (`systemctl start craned`), or `install -d -m 0755 {d}`",
        )
    st = d.stat()
    if not stat.S_ISDIR(st.st_mode):
        return Finding(
            check,
            FAIL,
            f"{d} is not a directory",
            f"remove it: `rm {d}` (craned makes the directory)",
        )
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        return Finding(
            check,
            FAIL,
            f"{d} is world-writable ({_mode(d)}): any local user can replace the daemon's "
            "sockets with their own",
            f"chmod 0755 {d}",
        )
    if st.st_mode & stat.S_IWGRP and st.st_gid != 0:
        return Finding(
            check,
            WARN,
            f"{d} is writable by group {st.st_gid} ({_mode(d)}): its members can replace the "
            "sockets",
            f"chmod g-w {d}",
        )
    if not st.st_mode & stat.S_IXOTH:
        return Finding(
            check,
            WARN,
            f"{d} ({_mode(d)}) is not searchable by other users: only its owner and group can "
            "reach the sockets in it",
            f"chmod o+x {d} if every local user may be a guest (what each may do is the "
            "daemon's call)",
        )
    return Finding(check, OK, f"{d} {_mode(d)}, owner {st.st_uid}")


def _socket_findings(cfg: DaemonConfig) -> list[Finding]:
    out = [_dir_finding("run dir", Path(cfg.run_dir), "state, sockets, ledgers")]
    for address in cfg.listen:
        target = to_grpc_target(address)
        if not target.startswith("unix:"):
            continue
        path = Path(target[len("unix:") :])
        if path.parent != Path(cfg.run_dir):
            out.append(_dir_finding("socket dir", path.parent, f"holds {path.name}"))
        out.append(_socket_file(path, 0o666, "guests of every local user connect here"))
    domains = Path(cfg.run_dir) / "domains"
    if domains.is_dir():
        out.append(_dir_finding("domain sockets dir", domains, "libvirt domains' sockets"))
        for sock in sorted(domains.glob("*.sock")):
            out.append(_socket_file(sock, 0o660, "only the domain's QEMU (its group) may connect"))
    return out


def _socket_file(path: Path, want: int, why: str) -> Finding:
    check = f"socket {path.name}"
    if not path.exists():
        return Finding(
            check,
            WARN,
            f"{path} does not exist: craned is not running (or listens elsewhere)",
            "systemctl start craned (then `journalctl -u craned` if it does not stay up)",
        )
    st = path.stat()
    if not stat.S_ISSOCK(st.st_mode):
        return Finding(
            check, FAIL, f"{path} is not a socket", f"rm {path} && systemctl restart craned"
        )
    mode = st.st_mode & 0o777
    if want == 0o660 and mode & 0o007:
        return Finding(
            check,
            FAIL,
            f"{path} is {_mode(path)}: every local user can act as that domain's guest",
            f"chmod 0660 {path}",
        )
    if want == 0o666 and mode & 0o006 != 0o006:
        return Finding(
            check,
            WARN,
            f"{path} is {_mode(path)}: only its owner and group can connect ({why})",
            f"chmod 0666 {path} (craned sets it at start)",
        )
    return Finding(check, OK, f"{path} {_mode(path)}")


def _tls_findings(cfg: DaemonConfig) -> list[Finding]:
    if not cfg.tls_cert:
        tcp = [a for a in cfg.listen if a.startswith("tcp://")]
        if tcp and cfg.insecure_tcp:
            return [
                Finding(
                    "tls",
                    WARN,
                    f"{', '.join(tcp)} is plain TCP (insecure_tcp): every caller there is an "
                    "operator",
                    "set tls_cert, tls_key and client_ca (mutual TLS) for anything but development",
                )
            ]
        return [Finding("tls", SKIP, "no tls_cert configured (no tcp:// listener needs one)")]
    return check_tls_files(
        cfg.tls_cert, cfg.tls_key, cfg.client_ca, "craned", ca_required=bool(cfg.peers)
    )


def _hook_findings(cfg: DaemonConfig, hooks_dir: Path) -> list[Finding]:
    libvirt = Path("/etc/libvirt").exists() or hooks_dir != Path(HOOKS_DIR)
    if not (cfg.domains or cfg.vsock_port or libvirt):
        return [Finding("libvirt hook", SKIP, "no libvirt on this host and no domains configured")]
    hook = hooks_dir / "qemu.d" / "crane"
    address = next(
        (a for a in cfg.listen if a.startswith("unix://")), "unix:///run/crane/crane.sock"
    )
    fix = (
        f"crane libvirt-hook install --daemon {address} --hooks-dir {hooks_dir}"
        " && systemctl restart libvirtd"
    )
    # domains configured: VM guests are meant to move with their VMs; libvirt alone: maybe not
    miss = FAIL if cfg.domains or cfg.vsock_port else WARN
    if not hook.exists():
        return [
            Finding(
                "libvirt hook",
                miss,
                f"{hook} is not installed: `virsh migrate --live` of a Crane guest would leave "
                "its GPU state behind",
                fix,
            )
        ]
    text = hook.read_text(errors="replace")
    if "libvirt-hook" not in text:
        return [Finding("libvirt hook", FAIL, f"{hook} is not Crane's hook", fix)]
    if not os.access(hook, os.X_OK):
        return [
            Finding(
                "libvirt hook",
                FAIL,
                f"{hook} is not executable (libvirt skips it)",
                f"chmod 0755 {hook}",
            )
        ]
    interpreter = text.split("exec ", 1)[-1].split(" ", 1)[0].strip("'\"")
    if interpreter.startswith("/") and not os.access(interpreter, os.X_OK):
        return [
            Finding(
                "libvirt hook",
                FAIL,
                f"{hook} runs {interpreter}, which is gone (a removed venv?)",
                fix,
            )
        ]
    return [Finding("libvirt hook", OK, f"{hook} installed")]


def host_findings(config: str | None, hooks_dir: str = HOOKS_DIR) -> list[Finding]:
    cfg, found = _config(config)
    out = [found]
    if cfg is None:
        return out
    out += _gpu_findings(cfg)
    out += _socket_findings(cfg)
    out += _tls_findings(cfg)
    out += _hook_findings(cfg, Path(hooks_dir))
    return out
