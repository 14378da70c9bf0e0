"""Fixtures of the ``vm`` tests: skip with the reason when the host cannot boot a guest, the
guest image (built once per content key, see vm-images/), and booting it under QEMU TCG.

Host requirements come from Debian packages that scripts/vm_deps.sh installs (``make test``
runs it); where it could not, the tests skip naming what is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.vm.image import Booted, boot, ensure_image, missing_tools


@pytest.fixture(autouse=True)
def _vm_requirements(request: pytest.FixtureRequest) -> None:
    """A ``vm`` test on a host without QEMU (or the tools that build the image) skips, naming
    each missing tool and the script that installs them."""
    if request.node.get_closest_marker("vm") is None:
        return
    missing = missing_tools()
    if missing:
        pytest.skip(f"vm tests need {', '.join(missing)}: run scripts/vm_deps.sh as root")


@pytest.fixture(scope="session")
def vm_image() -> Any:
    """The guest image (vm-images/build.py; cached under $CRANE_VM_IMAGE_CACHE or
    ~/.cache/crane/vm-images, so only the first session after a change builds it)."""
    missing = missing_tools()
    if missing:
        pytest.skip(f"vm tests need {', '.join(missing)}: run scripts/vm_deps.sh as root")
    return ensure_image()


@pytest.fixture
def boot_vm(vm_image: Any, tmp_path: Path) -> Iterator[Callable[..., Booted]]:
    """``boot_vm(run, env={}, forwards={port: unix_socket}, memory_mb=512)``: the image under
    QEMU TCG running ``run``; every guest it started is killed at the end of the test."""
    started: list[Booted] = []

    def start(run: str | None = None, env: Mapping[str, str] | None = None,
              forwards: Mapping[int, Path] = {}, memory_mb: int = 512) -> Booted:  # fmt: skip
        log = tmp_path / f"serial-{len(started)}.log"
        guest = boot(vm_image, log, run, env, forwards, memory_mb)
        started.append(guest)
        return guest

    yield start
    for guest in started:
        guest.kill()
