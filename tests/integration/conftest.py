"""Integration fixtures: a real craned (own process, own workers) on a temp-dir unix socket."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from crane.daemon.launcher import DaemonProcess
from crane.guest.session import Session


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path / "run", ["sim:h100-80gb"])
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def session(daemon: DaemonProcess) -> Iterator[Session]:
    s = Session(daemon.address, client="pytest")
    try:
        yield s
    finally:
        s.close()
