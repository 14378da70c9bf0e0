"""The module image store's size bound: least recently used, unpinned images go first; pins of
live owners keep an image, pins of dead ones do not."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crane.modules.store import DigestMismatch, ImageStore


def _image(i: int, size: int = 1000) -> tuple[bytes, bytes]:
    data = i.to_bytes(4, "little") * (size // 4)
    return hashlib.sha256(data).digest(), data


def _age(store: ImageStore, digest: bytes, t: float) -> None:
    os.utime(store.path(digest), (t, t))


def test_put_past_the_bound_evicts_least_recently_used(tmp_path: Path) -> None:
    store = ImageStore(tmp_path, limit=3000)
    digests = []
    for i in range(3):
        d, data = _image(i)
        store.put(d, data)
        _age(store, d, 1000 + i)
        digests.append(d)
    assert store.get(digests[0]) is not None  # a hit makes image 0 the most recently used
    d3, data3 = _image(3)
    store.put(d3, data3)
    assert store.size() <= 3000
    assert digests[1] not in store  # the least recently used
    assert digests[0] in store and digests[2] in store and d3 in store


def test_pinned_images_survive_and_are_released_with_their_owner(tmp_path: Path) -> None:
    store = ImageStore(tmp_path, limit=2500)
    d0, data0 = _image(0)
    store.pin(d0)
    store.put(d0, data0)
    _age(store, d0, 1)
    for i in range(1, 6):
        d, data = _image(i)
        store.put(d, data)
        assert store.size() <= 2500
    assert d0 in store  # oldest, but pinned
    store.unpin(d0)
    d, data = _image(6)
    store.put(d, data)
    assert d0 not in store


def test_pins_of_a_dead_owner_are_stale(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(dead.stdout)
    d0, data0 = _image(0)
    ImageStore(tmp_path, limit=1500, owner=pid).pin(d0)
    store = ImageStore(tmp_path, limit=1500)
    store.put(d0, data0)
    _age(store, d0, 1)
    d1, data1 = _image(1)
    store.put(d1, data1)
    assert d0 not in store and d1 in store
    assert not (tmp_path / ".pins" / str(pid)).exists()


def test_release_owner_and_reset_drop_pins(tmp_path: Path) -> None:
    store = ImageStore(tmp_path, limit=1500)
    d0, data0 = _image(0)
    store.pin(d0)
    store.put(d0, data0)
    store.release_owner(os.getpid())
    assert store.pinned() == set()
    store.pin(d0)
    (tmp_path / f".{d0.hex()}.123.tmp").write_bytes(b"half")
    store.reset()
    assert store.pinned() == set()
    assert not list(tmp_path.glob(".*.tmp"))


def test_eviction_logs_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = ImageStore(tmp_path, limit=2000)
    for i in range(2):
        store.put(*_image(i))
    with caplog.at_level(logging.INFO, logger="crane.modules"):
        store.put(*_image(2))
    lines = [r.getMessage() for r in caplog.records if "module cache" in r.getMessage()]
    assert len(lines) == 1 and "evicted 1 image(s), 1000 bytes" in lines[0]


def test_unbounded_store_keeps_everything_and_refuses_a_wrong_digest(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    for i in range(5):
        store.put(*_image(i))
    assert store.size() == 5000
    with pytest.raises(DigestMismatch):
        store.put(_image(0)[0], b"other bytes")
