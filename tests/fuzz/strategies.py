"""Hypothesis strategies for the wire: every op of the call table with arguments drawn by their
wire kind, around the fuzz session's real objects (so that checks deep in the worker are
reached) and at the boundaries (0, 1, -1, 2^63, 2^64-1, wrong-kind handles, unaligned pointers
and pointers at the window's and allocations' edges, sizes past anything)."""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass

from hypothesis import strategies as st

from crane.api.ops import OPS, Kind, Op
from crane.guest.handles import HandleKind
from tests.fuzz.harness import ALLOC, Pool

__all__ = ["Call", "call", "mutate", "mutations", "resolve", "wire"]

M64 = (1 << 64) - 1
_U64_EDGES = [0, 1, 2, 3, M64, M64 - 1, 1 << 63, (1 << 63) - 1, (1 << 63) + 1, 1 << 32,
              (1 << 32) - 1, 1 << 31, (1 << 31) - 1]  # fmt: skip
_SIZES = [0, 1, 2, 3, 4, 5, 7, 8, 16, 4095, 4096, ALLOC - 1, ALLOC, ALLOC + 1, 2 << 20,
          (2 << 20) + 1, 4 << 20, 64 << 20, 1 << 40, (1 << 40) + 1, 1 << 41, 1 << 48, 1 << 63,
          M64]  # fmt: skip
_OFFSETS = [0, 1, -1, 3, 4, 7, 8, -4, -8, ALLOC - 1, ALLOC, ALLOC + 1, 2 << 20, -(2 << 20)]
_U32 = [0, 1, 2, 3, 4, 8, 0xFF, 0xFFFF, 0x10000, (1 << 31) - 1, 1 << 31, (1 << 32) - 1]
_I32 = [0, 1, -1, 2, (1 << 31) - 1, -(1 << 31)]
_DIMS = [0, 1, 2, 3, 32, 64, 1024, 1025, 65535, 65536, (1 << 31) - 1, 1 << 31, (1 << 32) - 1]
#: Most blocks a launch the device accepts may have (keeps the simulator's work small).
_MAX_BLOCKS = 64

u64 = st.sampled_from(_U64_EDGES) | st.integers(0, M64)
u32 = st.sampled_from(_U32) | st.integers(0, (1 << 32) - 1)
i32 = st.sampled_from(_I32) | st.integers(-(1 << 31), (1 << 31) - 1)

# Values that depend on the fuzz session (its pool's handles and addresses, its sequence numbers)
# are drawn as symbols and resolved when the case runs (:func:`resolve`): what Hypothesis draws
# must not depend on state outside it, or it cannot replay and shrink a case.


@dataclass(frozen=True)
class PoolHandle:
    index: int  # into Pool.handles()


@dataclass(frozen=True)
class PoolPointer:
    index: int  # into Pool.pointers()
    offset: int


@dataclass(frozen=True)
class Params:
    """axpb's parameter buffer (x, y, a, b, n) packed with the real layout."""

    x: object
    y: object
    a: int
    b: int
    n: int


IMAGE = "image"  # the pool's module image
DIGEST = "digest"  # its digest

_kinds = st.sampled_from([int(k) for k in HandleKind] + [0, 0xFF])
handle = st.one_of(
    st.integers(0, 5).map(PoolHandle),
    u64,
    st.builds(lambda k, n: (k << 56) | n, _kinds, st.integers(0, 1 << 20)),
    st.sampled_from([0, 1, 2]),
)
_near = st.builds(
    PoolPointer,
    st.integers(0, 7),
    st.sampled_from(_OFFSETS) | st.integers(-(1 << 16), 1 << 16),
)
devptr = _near | _near | u64
size = st.sampled_from(_SIZES) | st.integers(0, M64)


def _config(grid: tuple[int, int, int], block: tuple[int, int, int], shared: int) -> tuple:
    """A launch configuration, shrunk to a few blocks when the device would accept a larger
    grid (the fuzz tests the checks, not the simulator's speed)."""
    gx, gy, gz = grid
    bx, by, bz = block
    grid_ok = 1 <= gx < (1 << 31) and 1 <= gy <= 65535 and 1 <= gz <= 65535
    block_ok = 1 <= bx <= 1024 and 1 <= by <= 1024 and 1 <= bz <= 64 and bx * by * bz <= 1024
    if grid_ok and block_ok and gx * gy * gz > _MAX_BLOCKS:
        grid = (min(gx, _MAX_BLOCKS), 1, 1)
    return grid, block, shared


dims = st.tuples(*[st.sampled_from(_DIMS)] * 3)
config = st.builds(_config, dims, dims, st.sampled_from(_U32) | st.integers(0, 256 << 10))

_ptr = st.integers(0, 1).map(lambda i: PoolPointer(i, 0)) | devptr
_n = st.sampled_from([0, 1, 16, ALLOC // 4, ALLOC // 4 + 1, -1, (1 << 31) - 1])
_params = st.builds(Params, _ptr, _ptr, i32, i32, _n)
params = _params | _params | st.binary(max_size=64)


def data_for(op: Op) -> st.SearchStrategy[object]:
    if op.data_in is None:
        return st.just(b"") | st.binary(max_size=16)  # data where none is expected
    if op.data_in == "src":
        big = st.sampled_from([4096, ALLOC, ALLOC + 1, 1 << 20]).map(lambda n: b"\x5a" * n)
        return st.binary(max_size=256) | big
    if op.data_in == "image":
        return st.sampled_from([b"", IMAGE]) | st.binary(max_size=64)
    if op.data_in == "name":
        names = [b"axpb", b"", b"axpb\x00", b"\xff\xfe", b"launches"]
        return st.sampled_from(names) | st.binary(max_size=32)
    return params


_ARG = {
    Kind.HANDLE: handle,
    Kind.DEVPTR: devptr,
    Kind.SIZE: size,
    Kind.U32: u32,
    Kind.I32: i32,
    Kind.U64: u64,
    Kind.F32: st.floats(width=32, allow_nan=True),
    Kind.HASH: st.sampled_from([DIGEST, b"\0" * 32, b"\xff" * 32])
    | st.binary(min_size=32, max_size=32),
    Kind.LAUNCH_CONFIG: config,
}

#: Every op but SESSION_CLOSE (its own test: each one costs a session).
FUZZ_OPS = [o for o in OPS if not o.retired and o.name != "SESSION_CLOSE"]


@dataclass(frozen=True)
class Call:
    """One drawn call: its op, its argument values (None: ``raw_args`` instead, bytes of a
    wrong length) and its data, symbols included."""

    op: Op
    values: tuple | None
    raw_args: bytes
    data: object


@dataclass(frozen=True)
class Fresh:
    """A handle no object of the session has yet, of ``kind`` (what a creation names)."""

    kind: int


_fresh_ids = itertools.count(1 << 40)

#: Pool.handles() positions by role.
_ROLE = {"ctx": 0, "module": 1, "function": 2, "stream": 3, "event": 4, "start": 4, "end": 5}
#: The object a creating op names, by op.
_CREATES = {
    "CTX_CREATE": ("ctx", HandleKind.CONTEXT),
    "STREAM_CREATE": ("stream", HandleKind.STREAM),
    "EVENT_CREATE": ("event", HandleKind.EVENT),
    "MODULE_LOAD": ("module", HandleKind.MODULE),
    "FUNCTION_BIND": ("function", HandleKind.FUNCTION),
}
_small_config = st.builds(
    _config,
    st.tuples(st.integers(1, 4), st.just(1), st.just(1)),
    st.tuples(st.sampled_from([32, 64, 128, 256]), st.just(1), st.just(1)),
    st.sampled_from([0, 0, 1024]),
)


def _plausible(op: Op, name: str, kind: Kind) -> st.SearchStrategy[object]:
    """A value that names the pool's objects the way a correct guest would, so that the rest
    of the call's arguments reach the op's work rather than its first check."""
    created = _CREATES.get(op.name)
    if kind is Kind.HANDLE:
        if created and created[0] == name:
            return st.just(Fresh(int(created[1])))
        if name == "stream":
            return st.sampled_from([PoolHandle(3), PoolHandle(3), 0])
        return st.just(PoolHandle(_ROLE.get(name, 0)))
    if kind is Kind.DEVPTR:
        if op.name in ("MEM_MAP_CHUNK", "MEM_UNMAP_CHUNK"):  # past the pool's chunk, or it
            return st.sampled_from([PoolPointer(3, 0), PoolPointer(3, 2 << 20), PoolPointer(2, 0)])
        if op.name == "MEM_ALLOC":  # free space inside the pool's chunk
            return st.sampled_from([PoolPointer(2, 2 * ALLOC), PoolPointer(2, 3 * ALLOC)])
        return st.builds(PoolPointer, st.integers(0, 1), st.sampled_from([0, 4, 64, 1024]))
    if kind is Kind.SIZE:
        if op.name == "MEM_MAP_CHUNK":
            return st.just(2 << 20)
        return st.sampled_from([1, 4, 16, 256, 1024, 4096])
    if kind is Kind.U32:
        if name == "elem_size":
            return st.sampled_from([1, 2, 4])
        if name.startswith("cluster_"):
            return st.just(1)
        return st.sampled_from([0, 0, 1, 0xFF]) if name == "value" else st.just(0)
    if kind is Kind.I32:
        return st.just(0)
    if kind is Kind.HASH:
        return st.just(DIGEST)
    if kind is Kind.LAUNCH_CONFIG:
        return _small_config
    return _ARG[kind]


_valid_params = st.builds(
    Params,
    st.integers(0, 1).map(lambda i: PoolPointer(i, 0)),
    st.integers(0, 1).map(lambda i: PoolPointer(i, 0)),
    i32,
    i32,
    st.sampled_from([0, 1, 100, ALLOC // 4]),
)


def _plausible_data(op: Op) -> st.SearchStrategy[object]:
    if op.data_in == "src":
        return st.binary(min_size=1, max_size=1024)
    if op.data_in == "image":
        return st.sampled_from([IMAGE, b""])
    if op.data_in == "name":
        return st.just(b"axpb")
    if op.data_in == "params":
        return _valid_params
    return st.just(b"")


def call(ops: list[Op] = FUZZ_OPS) -> st.SearchStrategy[Call]:
    """One call of any op: its arguments as a correct guest would pass them around the pool's
    objects, or by wire kind at random and at the boundaries, or a mix of both (one random
    argument among plausible ones reaches the deepest checks), or bytes of a wrong length."""

    def for_op(op: Op) -> st.SearchStrategy[Call]:
        plausible = [_plausible(op, p.name, p.kind) for p in op.args]
        wild = [_ARG[p.kind] for p in op.args]
        values = st.tuples(*wild)
        good = st.tuples(*plausible)
        mixed = st.tuples(*[a | b for a, b in zip(plausible, wild, strict=True)])
        wrong = st.binary(max_size=48)  # too short, too long
        data = _plausible_data(op) | data_for(op)
        return st.builds(Call, st.just(op), good | mixed | values | good | st.none(), wrong, data)

    return st.sampled_from(ops).flatmap(for_op)


def resolve(value: object, pool: Pool, image: bytes) -> object:
    """A drawn value with its symbols replaced by the pool's objects."""
    if isinstance(value, PoolHandle):
        return pool.handles()[value.index]
    if isinstance(value, Fresh):
        return (value.kind << 56) | next(_fresh_ids)
    if isinstance(value, PoolPointer):
        return (pool.pointers()[value.index] + value.offset) & M64
    if isinstance(value, Params):
        x, y = (resolve(v, pool, image) for v in (value.x, value.y))
        return struct.pack("<QQiii", x, y, value.a, value.b, value.n)
    if value == IMAGE:
        return image
    if value == DIGEST:
        return pool.digest
    if isinstance(value, tuple):
        return tuple(resolve(v, pool, image) for v in value)
    return value


def wire(c: Call, pool: Pool, image: bytes) -> tuple[int, bytes, bytes]:
    """The call as (op id, argument bytes, data) for this pool."""
    args = c.raw_args if c.values is None else c.op.pack(*resolve(c.values, pool, image))
    data = resolve(c.data, pool, image)
    assert isinstance(data, bytes)
    return c.op.id, args, data


@dataclass(frozen=True)
class Mutation:
    how: str
    at: float  # position as a fraction of the length, so that it fits any length
    bit: int
    width: int
    value: int
    blob: bytes


mutation = st.builds(
    Mutation,
    st.sampled_from(["truncate", "flip", "flip", "word", "insert", "delete"]),
    st.floats(0, 1) | st.floats(0, 0.02),  # the second: the head, where lengths live
    st.integers(0, 7),
    st.sampled_from([4, 8]),
    st.sampled_from([0, 1, (1 << 31) - 1, (1 << 32) - 1, M64, 1 << 40]),
    st.binary(min_size=1, max_size=64),
)
mutations = st.lists(mutation, min_size=1, max_size=4)


def mutate(data: bytes, how: list[Mutation]) -> bytes:
    """``data`` damaged: truncated, bits flipped, a word overwritten with a huge length, bytes
    inserted or deleted, or several of these."""
    out = bytearray(data)
    for m in how:
        n = len(out)
        if n == 0:
            out += m.blob
            continue
        pos = min(int(m.at * n), n - 1)
        if m.how == "truncate":
            del out[pos:]
        elif m.how == "flip":
            out[pos] ^= 1 << m.bit
        elif m.how == "word":
            mask = (1 << (8 * m.width)) - 1
            out[pos : pos + m.width] = (m.value & mask).to_bytes(m.width, "little")
        elif m.how == "insert":
            out[pos:pos] = m.blob
        else:
            del out[pos : pos + len(m.blob)]
    return bytes(out)
