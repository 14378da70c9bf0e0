"""The run directory's module cache is bounded: loading many distinct images keeps it under
``--module-cache-bytes``, evicting least recently used images no live session has loaded (one
log line each time), while an image a session still has loaded stays (its checkpoint reads it
back from the cache) until that session ends."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

from crane.cli.control_client import ControlClient
from crane.craned.launcher import DaemonProcess
from crane.guest.session import GuestSession
from crane.modules.store import ImageStore

BOUND = 16 << 10


def _ptx(i: int) -> bytes:
    """A valid PTX module of about 2 KiB, distinct per ``i`` (its variable's initial value)."""
    pad = "".join(f"// padding line {j:04d} of module {i}\n" for j in range(50))
    return (
        ".version 7.8\n.target sm_80\n.address_size 64\n"
        f".visible .global .align 4 .b32 v = {i};\n"
        ".visible .entry k()\n{\n\tret;\n}\n" + pad
    ).encode()


def test_many_images_stay_under_the_bound_and_images_in_use_survive(tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path / "run", extra_args=["--module-cache-bytes", str(BOUND)])
    store = ImageStore(d.run_dir / "modules")
    try:
        with GuestSession(d.address) as keeper:
            kept = _ptx(0)
            mod = keeper.module_load(kept)  # loaded first: the least recently used image
            with GuestSession(d.address) as s:
                for i in range(1, 41):
                    m = s.module_load(_ptx(i))
                    addr, size = m.globals["v"]
                    assert int.from_bytes(s.memcpy_dtoh(addr, size), "little") == i
                    s.module_unload(m)
                    assert store.size() <= BOUND
            assert hashlib.sha256(kept).digest() in store  # in use: never evicted
            evictions = re.findall(r"module cache: evicted \d+ image", d.log_text())
            assert 0 < len(evictions) <= 40  # one line per eviction, none per load below it
            # the keeper's checkpoint needs its image from the cache, and gets it
            with ControlClient(d.address, timeout=None) as c:
                c.checkpoint(keeper.session_id, "k.ckpt", release=False)
            addr, size = mod.globals["v"]
            assert int.from_bytes(keeper.memcpy_dtoh(addr, size), "little") == 0
        # the session ended: its pins went with its worker, so a turnover of the cache takes it
        with ControlClient(d.address) as c:
            deadline = time.monotonic() + 30
            while c.sessions().sessions and time.monotonic() < deadline:
                time.sleep(0.05)
        with GuestSession(d.address) as s:
            for i in range(41, 61):
                s.module_unload(s.module_load(_ptx(i)))
        assert hashlib.sha256(kept).digest() not in store
        assert store.size() <= BOUND
    finally:
        d.stop()
