"""The guest image boots under QEMU TCG, runs the command of its kernel command line with the
given environment, reports its exit status and powers off."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.vm.image import Booted, kernel_cmdline

pytestmark = pytest.mark.vm


def test_boot_runs_command_and_powers_off(boot_vm: Callable[..., Booted]) -> None:
    start = time.monotonic()
    guest = boot_vm("echo value=$CRANE_PROBE; ip -4 addr show eth0; exit 3",
                    env={"CRANE_PROBE": "a b"})  # fmt: skip
    rc, out = guest.wait(timeout=60)
    elapsed = time.monotonic() - start
    assert rc == 3, out
    assert "value=a b" in out
    assert "inet 10.0.2.15/24" in out
    assert out.index("CRANE-VM-READY") < out.index("value=a b")
    print(f"boot to power-off: {elapsed:.1f} s")


def test_cmdline_refuses_unquotable_values() -> None:
    with pytest.raises(ValueError, match="double quote"):
        kernel_cmdline('echo "x"')
    with pytest.raises(ValueError, match="variable name"):
        kernel_cmdline("true", env={"A-B": "1"})
