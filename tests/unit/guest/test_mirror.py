"""The coherence protocol of mirrored host memory (crane.guest.mirror), against a device that is
a dict of bytes: pushes send only changed pages, pulls merge only the bytes the device changed."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from crane.guest.mirror import PAGE, HostMirrors, Mirror


class FakeDevice:
    def __init__(self) -> None:
        self.mem: dict[int, bytearray] = {}
        self.writes: list[tuple[int, int, int]] = []  # (address, size, stream)

    def write(self, addr: int, data: memoryview, stream: int) -> None:
        self.writes.append((addr, data.nbytes, stream))
        for base, buf in self.mem.items():
            if base <= addr < base + len(buf):
                buf[addr - base : addr - base + data.nbytes] = bytes(data)
                return
        raise AssertionError(f"write outside device memory at {addr:#x}")

    def read(self, addr: int, size: int) -> bytes:
        return bytes(self.mem[addr][:size])


@pytest.fixture
def host():
    buf = (ctypes.c_uint8 * (3 * PAGE + 100))()
    return buf, ctypes.addressof(buf)


def test_push_sends_only_changed_pages_and_pull_merges(host):
    buf, addr = host
    size = 3 * PAGE + 100
    dev = FakeDevice()
    dev.mem[0x1000_0000] = bytearray(size)
    mirrors = HostMirrors(dev.write, dev.read)
    m = Mirror(addr, 0x1000_0000, size, "registered")
    buf[5] = 9
    mirrors.add(m, stream=3)
    assert dev.writes == [(0x1000_0000, size, 3)] and dev.mem[0x1000_0000][5] == 9
    dev.writes.clear()
    mirrors.push(0)
    assert dev.writes == []  # nothing changed
    buf[PAGE + 1] = 1
    buf[3 * PAGE + 99] = 2  # the short last page
    mirrors.push(7)
    assert dev.writes == [(0x1000_0000 + PAGE, PAGE, 7), (0x1000_0000 + 3 * PAGE, 100, 7)]
    # the device writes byte 10; the host meanwhile wrote byte 11 (same page): both survive
    mirrors.issued(7)
    dev.mem[0x1000_0000][10] = 44
    buf[11] = 55
    mirrors.pull(7)
    assert buf[10] == 44 and buf[11] == 55 and buf[5] == 9
    assert not mirrors.pending
    dev.writes.clear()
    mirrors.push(0)  # the host's byte 11 still has to reach the device
    assert dev.writes == [(0x1000_0000, PAGE, 0)] and dev.mem[0x1000_0000][11] == 55


def test_pull_is_skipped_without_device_work_and_tracks_streams(host):
    _buf, addr = host
    dev = FakeDevice()
    dev.mem[0x2000] = bytearray(PAGE)
    reads = []
    mirrors = HostMirrors(dev.write, lambda a, n: reads.append(a) or dev.read(a, n))
    mirrors.add(Mirror(addr, 0x2000, PAGE, "registered"))
    mirrors.pull(None)
    assert reads == []
    mirrors.issued(1)
    mirrors.issued(2)
    mirrors.pull(1)
    assert mirrors.pending == {2} and len(reads) == 1
    mirrors.pull(None)
    assert not mirrors.pending and len(reads) == 2


def test_lookup_by_either_address(host):
    _, addr = host
    dev = FakeDevice()
    dev.mem[0x5000] = bytearray(PAGE)
    mirrors = HostMirrors(dev.write, dev.read)
    m = Mirror(addr, 0x5000, PAGE, "registered")
    mirrors.add(m)
    assert mirrors.by_dev(0x5000 + PAGE - 1) is m and mirrors.by_dev(0x5000 + PAGE) is None
    assert mirrors.by_host(addr + 7) is m and mirrors.by_host(addr - 1) is None
    mirrors.remove(m)
    assert not mirrors and mirrors.by_dev(0x5000) is None
    assert np.array_equal(m.shadow, np.zeros(PAGE, np.uint8))
