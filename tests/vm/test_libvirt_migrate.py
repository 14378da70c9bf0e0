"""Live migration of a libvirt VM whose guest runs a CUDA program under Crane, end to end.

Two libvirtd and two craned (simulated A100 then H100) on this machine, the libvirt hook
installed on both hosts; a TCG guest (vm-images) runs vm-images/programs/migrate_loop under
Crane's library, dialing ``vm://10.0.2.100:7000`` (QEMU's guest forward to its domain's socket
on the host's daemon). Mid-run the VM moves, by ``crane migrate DOMAIN`` and by a plain ``virsh
migrate --live`` (hook + ``crane libvirt-watch``); the program's output (serial console, source
then destination) must be identical to an unmigrated run's. Failures: a destination daemon that
cannot be reached refuses the migration and the VM finishes on the source; a libvirt migration
cancelled midway rolls back, the GPU state still on the source.

One lab for the module (libvirtd and craned start once); each test starts its own guest.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crane.cli.control_client import ControlClient
from crane.cli.main import main as crane_main
from crane.vm.migrate import MigrationRefused, VmMigration, VmMigrationFailed
from tests.vm.libvirt_lab import lab_missing
from tests.vm.vmlab import Lab, lab

pytestmark = pytest.mark.vm

MIGRATE_AT = r"^tick 5\b"


#: A known bug (docs/operators-vm.md, Limits): a held session whose guest resumed at the
#: destination the moment it was committed computes a different result from there on; it
#: reproduces without a VM (a vm:// forward cut during the hold), not with a plain migration.
def _same_output(out: list[str], reference: list[str]) -> None:
    assert out[-1] == "PASSED", out[-5:]
    if out != reference:
        pairs = enumerate(zip(out, reference, strict=False))
        diff = next((i for i, (x, y) in pairs if x != y), min(len(out), len(reference)))
        raise AssertionError(
            f"the migrated program's output differs from an unmoved run's from line {diff}: "
            f"{out[diff : diff + 2]} vs {reference[diff : diff + 2]}"
        )


@pytest.fixture(scope="module")
def vmlab(tmp_path_factory: pytest.TempPathFactory, vm_image: Any) -> Iterator[Lab]:
    why = lab_missing()
    if why:
        pytest.skip(f"libvirt lab: {why}")
    if "migrate_loop" not in vm_image.manifest.get("programs", {}):
        pytest.skip("the guest image has no CUDA programs (no nvcc when it was built)")
    with lab(tmp_path_factory.mktemp("vmlab"), vm_image) as x:
        yield x


@pytest.fixture(scope="module")
def reference(vmlab: Lab) -> list[str]:
    """The program's output in a VM that never moves (the same daemon it starts on)."""
    return vmlab.start(vmlab.a).output()


def _sessions(address: str) -> list[Any]:
    with ControlClient(address) as c:
        return [s for s in c.sessions().sessions if s.state not in ("migrated", "closing")]


def _migrate_args(x: Lab, name: str, *more: str) -> list[str]:
    return [
        "migrate",
        name,
        "--to",
        x.b.libvirt.uri,
        "-c",
        x.a.libvirt.uri,
        "--dest-daemon",
        x.b.daemon.address,
        "--migrate-uri",
        "tcp://127.0.0.1",
        "--listen-address",
        "127.0.0.1",
        *more,
    ]


def _on(x: Lab, host: Any, name: str) -> bool:
    conn = host.conn()
    try:
        return name in [d.name() for d in conn.listAllDomains()]
    finally:
        conn.close()


def test_crane_migrate_domain_mid_run(
    vmlab: Lab, reference: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    g = vmlab.start(vmlab.a)
    g.wait_for(MIGRATE_AT, 120)
    assert crane_main(_migrate_args(vmlab, g.name, "--json")) == 0
    events = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    result = events[-1]
    assert result["event"] == "done", result
    assert [s["phase"] for s in result["sessions"]] == ["done"]
    assert any(e["event"] == "vm-suspended" for e in events)
    assert _on(vmlab, vmlab.b, g.name) and not _on(vmlab, vmlab.a, g.name)
    out = g.output()
    print(
        f"\ncrane migrate DOMAIN: total {result['total_s']:.2f} s, VM downtime "
        f"{result['vm_downtime_s']} s, GPU switchover "
        f"{result['sessions'][0]['switchover_s'] * 1e3:.1f} ms, program's longest pause "
        f"{g.max_gap():.2f} s"
    )
    assert not [s for s in _sessions(vmlab.a.daemon.address) if s.domain == g.name]
    _same_output(out, reference)


def test_plain_virsh_migrate_moves_the_gpu_state_through_the_hook(
    vmlab: Lab, reference: list[str]
) -> None:
    watch = subprocess.Popen(
        [sys.executable, "-m", "crane.cli.main", "libvirt-watch", "--uri", vmlab.a.libvirt.uri,
         "--daemon", vmlab.a.daemon.address],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        time.sleep(1.0)  # it registers its callbacks
        g = vmlab.start(vmlab.a)
        g.wait_for(MIGRATE_AT, 120)
        t0 = time.monotonic()
        subprocess.run(
            ["virsh", "-c", vmlab.a.libvirt.uri, "migrate", "--live", g.name,
             vmlab.b.libvirt.uri, "tcp://127.0.0.1", "--listen-address", "127.0.0.1"],
            check=True,
            timeout=180,
        )  # fmt: skip
        took = time.monotonic() - t0
        out = g.output()
        print(f"\nvirsh migrate --live (hook): {took:.2f} s, longest pause {g.max_gap():.2f} s")
        assert not [s for s in _sessions(vmlab.a.daemon.address) if s.domain == g.name]
    finally:
        watch.terminate()
        log = watch.communicate(timeout=30)[0]
    decisions = [json.loads(ln)["event"] for ln in log.splitlines() if ln.startswith("{")]
    assert "stop" in decisions and "commit" in decisions, log
    _same_output(out, reference)


def test_destination_daemon_down_is_refused_and_the_vm_carries_on(
    vmlab: Lab, reference: list[str], tmp_path: Path
) -> None:
    g = vmlab.start(vmlab.a)
    g.wait_for(MIGRATE_AT, 120)
    mig = VmMigration(
        domain=g.name,
        source_uri=vmlab.a.libvirt.uri,
        dest_uri=vmlab.b.libvirt.uri,
        dest_daemon=f"unix:{tmp_path}/no-daemon.sock",
        migrate_uri="tcp://127.0.0.1",
        listen_address="127.0.0.1",
    )
    with pytest.raises(MigrationRefused, match="cannot take domain"):
        mig.run()
    assert _on(vmlab, vmlab.a, g.name)
    assert g.output() == reference
    assert not [s for s in _sessions(vmlab.b.daemon.address) if s.domain == g.name]


def test_libvirt_migration_cancelled_midway_rolls_back(vmlab: Lab, reference: list[str]) -> None:
    g = vmlab.start(vmlab.a)
    g.wait_for(MIGRATE_AT, 120)
    conn = vmlab.a.conn()
    try:
        conn.lookupByName(g.name).migrateSetMaxSpeed(64)  # MiB/s: a migration of some seconds
    finally:
        conn.close()
    seen: list[dict[str, Any]] = []
    mig: VmMigration

    def report(e: dict[str, Any]) -> None:
        seen.append(e)
        vm = e.get("vm") or {}
        if vm.get("memory_processed", 0) > (64 << 20):  # libvirt is well under way
            mig.cancel("cancelled by the test")

    mig = VmMigration(
        domain=g.name,
        source_uri=vmlab.a.libvirt.uri,
        dest_uri=vmlab.b.libvirt.uri,
        dest_daemon=vmlab.b.daemon.address,
        migrate_uri="tcp://127.0.0.1",
        listen_address="127.0.0.1",
        report=report,
    )
    done = threading.Event()
    with pytest.raises(VmMigrationFailed, match="rolled back"):
        try:
            mig.run()
        finally:
            done.set()
    assert any(e["event"] == "cancel" for e in seen)
    assert _on(vmlab, vmlab.a, g.name) and not _on(vmlab, vmlab.b, g.name)
    (s,) = [s for s in _sessions(vmlab.a.daemon.address) if s.domain == g.name]
    assert s.state in ("ready", "running"), s
    assert g.output() == reference
    assert not [s for s in _sessions(vmlab.b.daemon.address) if s.domain == g.name]


def test_the_same_migration_without_a_cuda_program(
    vmlab: Lab, capsys: pytest.CaptureFixture[str]
) -> None:
    """The baseline of the benchmark: the same VM and cadence of ticks, no GPU session; every
    tick arrives, in order, across the move."""
    g = vmlab.start(vmlab.a, program=False)
    g.wait_for(MIGRATE_AT, 120)
    assert crane_main(_migrate_args(vmlab, g.name, "--json")) == 0
    result = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln[:1] == "{"][-1]
    assert result["event"] == "done" and result["sessions"] == [], result
    out = g.output()
    assert [ln for ln in out if ln.startswith("tick ")] == [f"tick {i}" for i in range(60)]
    print(
        f"\nsame VM, no CUDA program: total {result['total_s']:.2f} s, VM downtime "
        f"{result['vm_downtime_s']} s, longest pause between ticks {g.max_gap():.2f} s"
    )
