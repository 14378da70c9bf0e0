"""The domain XML of a Crane guest and the hook's pure parts (no libvirt, no VM needed)."""

from __future__ import annotations

import io
import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from crane.vm.domain import (
    CRANE_NS,
    GUEST_ADDRESS,
    DomainSpec,
    crane_meta,
    domain_xml,
    guestfwd,
    retarget,
)
from crane.vm.hook import HookConfig, hook_script, install, run_hook

SPEC = DomainSpec(
    name="vm1",
    kernel="/srv/vmlinux",
    initrd="/srv/initrd.gz",
    cmdline='console=ttyS0 crane.run="a & b"',
    serial_log="/tmp/vm1.serial",
    crane_socket="/run/a/domains/vm1.sock",
    crane_daemon="unix:///run/a/crane.sock",
)


def test_domain_xml_is_valid_and_carries_the_crane_facts() -> None:
    xml = domain_xml(SPEC)
    root = ET.fromstring(xml)  # well-formed, the & in the command line escaped
    assert root.get("type") == "qemu"
    assert root.findtext("./os/cmdline") == SPEC.cmdline
    assert root.find("./devices/memballoon").get("model") == "none"
    assert root.find("./devices/serial/source").get("append") == "on"
    meta = crane_meta(xml)
    assert meta is not None
    assert (meta.daemon, meta.socket) == (SPEC.crane_daemon, SPEC.crane_socket)
    args = [a.get("value") for a in root.iter("{http://libvirt.org/schemas/domain/qemu/1.0}arg")]
    assert guestfwd(SPEC.crane_socket) in args
    assert "restrict=on" in guestfwd(SPEC.crane_socket)
    assert GUEST_ADDRESS == "vm://10.0.2.100:7000"


def test_retarget_changes_only_the_forward_and_the_metadata() -> None:
    xml = domain_xml(SPEC)
    out = retarget(xml, "/run/b/domains/vm1.sock", "tcp://host-b:7443")
    meta = crane_meta(out)
    assert meta is not None
    assert (meta.socket, meta.daemon) == ("/run/b/domains/vm1.sock", "tcp://host-b:7443")
    assert "UNIX-CONNECT:/run/b/domains/vm1.sock" in out and "/run/a/domains" not in out
    # nothing else moved: the same text once the two values are put back
    back = retarget(out, SPEC.crane_socket, SPEC.crane_daemon)
    assert back == xml


def test_refusals() -> None:
    with pytest.raises(ValueError, match="cannot go in a QEMU netdev"):
        guestfwd("/tmp/a,b.sock")
    with pytest.raises(ValueError, match="not a Crane guest"):
        retarget("<domain type='qemu'><name>x</name></domain>", "/x", "unix:/y")
    assert crane_meta("<domain><name>x</name></domain>") is None
    assert crane_meta("not xml") is None
    assert CRANE_NS in domain_xml(SPEC)


def test_hook_keeps_a_non_crane_domain_untouched() -> None:
    out, err = io.StringIO(), io.StringIO()
    plain = "<domain type='qemu'><name>other</name></domain>"
    cfg = HookConfig("unix:/nonexistent/crane.sock")
    assert run_hook(cfg, ["other", "migrate", "begin", "-"], io.StringIO(plain), out, err) == 0
    assert out.getvalue() == "" and err.getvalue() == ""
    # operations it does not handle: nothing printed, never a veto
    assert run_hook(cfg, ["other", "prepare", "begin", "-"], io.StringIO(plain), out, err) == 0
    assert run_hook(cfg, ["x"], io.StringIO(""), out, err) == 2


def test_hook_vetoes_when_this_hosts_daemon_cannot_attach(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    cfg = HookConfig(f"unix:{tmp_path}/no-daemon.sock")
    rc = run_hook(cfg, ["vm1", "migrate", "begin", "-"], io.StringIO(domain_xml(SPEC)), out, err)
    assert rc == 1
    assert out.getvalue() == ""
    assert err.getvalue().startswith("crane: this host's daemon") and "vm1" in err.getvalue()
    assert err.getvalue().count("\n") == 1


def test_install_writes_an_executable_script(tmp_path: Path) -> None:
    path = install(HookConfig("unix:/run/crane/crane.sock", "tcp://b:7443"), tmp_path)
    assert path == tmp_path / "qemu.d" / "crane"
    assert os.access(path, os.X_OK)
    text = path.read_text()
    assert "libvirt-hook --daemon unix:/run/crane/crane.sock --peer-address tcp://b:7443" in text
    assert text == hook_script(HookConfig("unix:/run/crane/crane.sock", "tcp://b:7443"))
    # run as libvirt does: a non-Crane domain passes through with nothing printed
    r = subprocess.run(
        [str(path), "other", "migrate", "begin", "-"],
        input="<domain><name>other</name></domain>",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (r.returncode, r.stdout) == (0, ""), r.stderr
