"""Memory through a real daemon: round trips with random data, info, isolation of ranges."""

from __future__ import annotations

import numpy as np
import pytest

from crane.api.generated.cuda_enums import CUresult
from crane.api.results import CudaError
from crane.guest.session import GuestSession

MiB = 1 << 20


@pytest.mark.parametrize("size", [1, 255, 4096, 3 * MiB + 17, 9 * MiB])
def test_htod_dtoh_round_trip_random(session: GuestSession, size: int) -> None:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    addr = session.mem_alloc(size)
    session.memcpy_htod(addr, data)
    assert session.memcpy_dtoh(addr, size) == data.tobytes()
    out = np.zeros(size, np.uint8)
    session.memcpy_dtoh(addr, out=out)
    assert np.array_equal(out, data)


def test_dtod_and_memsets(session: GuestSession) -> None:
    n = 1 << 16
    a, b = session.mem_alloc(4 * n), session.mem_alloc(4 * n)
    src = np.random.default_rng(0).integers(0, 2**32, n, dtype=np.uint32)
    session.memcpy_htod(a, src)
    session.memcpy_dtod(b, a, 4 * n)
    assert np.array_equal(np.frombuffer(session.memcpy_dtoh(b, 4 * n), np.uint32), src)
    session.memset_d32(b, 0xCAFEBABE, n)
    assert set(np.frombuffer(session.memcpy_dtoh(b, 4 * n), np.uint32)) == {0xCAFEBABE}
    session.memset_d16(b, 0x1234, 3)
    assert session.memcpy_dtoh(b, 8) == bytes.fromhex("341234123412feca")
    session.memset_d8(b + 1, 0xAB, 2)
    assert session.memcpy_dtoh(b, 4) == bytes.fromhex("34abab12")


def test_mem_get_info_reflects_use(session: GuestSession) -> None:
    free0, total = session.mem_get_info()
    assert total == session.device.total_mem and 0 < free0 <= total
    addr = session.mem_alloc(256 * MiB)
    free1, _ = session.mem_get_info()
    assert free0 - free1 >= 256 * MiB
    session.mem_free(addr)
    session.mem_alloc(2 * MiB)  # the allocator keeps at most one spare chunk
    free2, _ = session.mem_get_info()
    assert free2 > free1


def test_allocation_larger_than_free_memory(session: GuestSession) -> None:
    _, total = session.mem_get_info()
    with pytest.raises(CudaError) as e:
        session.mem_alloc(total + MiB)
    assert e.value.code == CUresult.CUDA_ERROR_OUT_OF_MEMORY
    addr = session.mem_alloc(MiB)  # the session carries on
    session.memcpy_htod(addr, b"ok")
    assert session.memcpy_dtoh(addr, 2) == b"ok"


def test_memory_is_charged_device_wide(daemon, session: GuestSession) -> None:  # type: ignore[no-untyped-def]
    other = GuestSession(daemon.address)
    try:
        before, _ = other.mem_get_info()
        session.mem_alloc(512 * MiB)
        after, _ = other.mem_get_info()
        assert before - after >= 512 * MiB
    finally:
        other.close()


def test_an_earlier_error_at_a_chunk_mapping_leaves_no_stale_chunk(session: GuestSession) -> None:
    """An asynchronous failure reported by the call that maps a new chunk: the call fails with
    it, and the next allocations still work (the mapped chunk used to stay mapped on the worker
    while the guest reused its range: "overlaps a mapped chunk" for every later allocation)."""
    from crane.api.ops import OPS_BY_NAME

    # a memset the guest does not check (sent as raw wire op) that the worker refuses
    op = OPS_BY_NAME["MEMSET"]
    session._t.enqueue(op, op.pack(0x10, 0, 4, 4, 0), b"", expect=False)
    with pytest.raises(CudaError):
        session.mem_alloc(96 << 20)  # needs a new chunk: mapped, then the earlier error
    for _ in range(3):
        x = session.mem_alloc(96 << 20)
        session.memset_d8(x, 1, 16)
        assert session.memcpy_dtoh(x, 4) == b"\x01" * 4
        session.mem_free(x)
