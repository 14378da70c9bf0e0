"""A real nvcc-built CUDA program, run through the interposer, migrated live between daemons
of two GPU models mid-run; its result must equal the same computation done by NumPy (the path
``crane demo`` shows)."""

from __future__ import annotations

from pathlib import Path

from crane.cli.demo_migrate import demo_migration, reference_checksum
from crane.daemon.launcher import DaemonProcess


def test_reference_is_the_unmigrated_computation() -> None:
    assert reference_checksum() == reference_checksum()  # deterministic, pure NumPy
    assert reference_checksum() != 0


def test_program_migrated_mid_run_finishes_correctly(tmp_path: Path, nvcc: str) -> None:
    lines: list[str] = []
    with DaemonProcess(tmp_path / "run-a", ["sim:h100-80gb"]) as source:
        code = demo_migration(source.address, tmp_path, nvcc, lines.append)
        log = source.log_text()
    text = "\n".join(lines)
    assert code == 0, text
    assert "migrated to" in text and "matches NumPy" in text
    assert "'running'" in text  # the session was live on the destination after the move
    assert "moved to" in log  # the source released it and redirects the guest
