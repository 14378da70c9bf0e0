"""VMM-mapped memory is session memory like any other: a checkpoint carries it to a daemon on
another GPU model, at the same addresses, including a handle that is unmapped but not released
(its contents stay with the handle) and a copy that runs across two mappings."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from crane.cli.control_client import ControlClient
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.guest.vmm import PROP

G = 2 << 20
PROP_DEV0 = PROP.pack(1, 0, 1, 0, 0, 0, 0, 0)  # pinned, device 0


def test_vmm_memory_survives_checkpoint_and_restore_elsewhere(tmp_path: Path) -> None:
    with (
        # A100 -> H100: a restore refuses a device offering less than the guest was told
        DaemonProcess(tmp_path / "a", ["sim:a100-80gb"], checkpoint_dir=tmp_path) as a,
        DaemonProcess(tmp_path / "b", ["sim:h100-80gb"], checkpoint_dir=tmp_path) as b,
        GuestSession(a.address, client="vmm", alternates=[b.address]) as s,
    ):
        v = s.vmm
        hint = s.va_window[0] + (128 << 30)
        base = v.reserve(4 * G, 0, hint)
        assert base == hint
        h1, h2, h3 = (v.create(G, PROP_DEV0) for _ in range(3))
        v.map(s.primary_context, base, G, 0, h1)
        v.map(s.primary_context, base + G, G, 0, h2)
        v.map(s.primary_context, base + 2 * G, G, 0, h3)
        data = np.arange(3 * G // 4, dtype=np.uint32) * 3 + 1
        s.memcpy_htod(base, data)  # one copy over three mappings
        v.unmap(base + 2 * G, G)  # h3 keeps its contents, unmapped
        with ControlClient(a.address, timeout=None) as c:
            c.checkpoint(s.session_id, str(tmp_path / "v.ckpt"), release=True)
        with ControlClient(b.address, timeout=None) as c:
            c.restore(str(tmp_path / "v.ckpt"))
        back = np.frombuffer(s.memcpy_dtoh(base, 2 * G), np.uint32)
        assert s._t.address == b.address
        assert (back == data[: 2 * G // 4]).all()
        v.map(s.primary_context, base + 3 * G, G, 0, h3)  # moved: contents follow
        moved = np.frombuffer(s.memcpy_dtoh(base + 3 * G, G), np.uint32)
        assert (moved == data[2 * G // 4 :]).all()
        for h, at in ((h1, base), (h2, base + G), (h3, base + 3 * G)):
            v.unmap(at, G)
            v.release(h)
        v.address_free(base, 4 * G)
