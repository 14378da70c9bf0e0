"""The fuzzers' side of a session: a pool of real objects to aim at, and the checks every case's
answer must pass.

Sessions are reused across cases (opening one costs a worker): a case that leaves the pool's
objects gone (it destroyed the context, freed or unmapped the pool's memory, unloaded its
module) or the context faulted (a sticky error) has the pool rebuilt in the same session by
destroying the context, which clears the fault as on a GPU; only a case that ends the session
opens a new one. A case whose session stops answering fails the test (a hang), as does an
answer of CUDA_ERROR_UNKNOWN (the worker's answer to an exception it did not expect: a bug).
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import struct
from dataclasses import dataclass

from crane.api.generated.cuda_enums import CUresult
from crane.api.ops import OPS_BY_ID, OPS_BY_NAME
from crane.api.results import STICKY
from crane.guest.handles import HandleKind
from crane.v1 import guest_pb2
from crane.wire.status import CRANE_NEED_IMAGE
from tests.fuzz.rawguest import RawSession, StreamEnded

__all__ = ["ALLOC", "CASE_TIMEOUT_S", "Fuzzer", "Pool", "op_call"]

#: Longest a case may take to be answered before it counts as a hang.
CASE_TIMEOUT_S = 60.0
#: Bytes of each of the pool's two allocations.
ALLOC = 64 << 10
CHUNK = 4 << 20
#: Cases a session serves before the fuzzer opens a fresh one (chunks the fuzz mapped add up).
ROTATE_AFTER = 1500

_VALID = {int(c) for c in CUresult} | {CRANE_NEED_IMAGE}
_STICKY = {int(c) for c in STICKY}
#: Ops that may take a pool object away (the pool is rebuilt after one aimed at it).
_TEARDOWN = {"CTX_DESTROY", "MEM_UNMAP_CHUNK", "MEM_FREE", "MODULE_UNLOAD", "STREAM_DESTROY",
             "EVENT_DESTROY"}  # fmt: skip


def op_call(name: str, *args: object, data: bytes = b"") -> tuple[int, bytes, bytes]:
    op = OPS_BY_NAME[name]
    return op.id, op.pack(*args), data


@dataclass
class Pool:
    """Live objects of the fuzz session: what arguments are drawn around."""

    ctx: int
    chunk: int
    x: int
    y: int
    module: int
    function: int
    stream: int
    events: tuple[int, int]
    var: int  # the module's __device__ variable
    window: tuple[int, int]
    digest: bytes

    def handles(self) -> list[int]:
        return [self.ctx, self.module, self.function, self.stream, *self.events]

    def pointers(self) -> list[int]:
        base, size = self.window
        area = base + size - (64 << 30)  # where module variables are placed
        return [self.x, self.y, self.chunk, self.chunk + CHUNK, self.var, base, base + size, area]

    def uses(self, value: int) -> bool:
        return value in self.handles() or self.chunk <= value < self.chunk + CHUNK


class Fuzzer:
    """A reused fuzz session with its object pool (see the module's docstring)."""

    def __init__(self, address: str, image: bytes) -> None:
        self.address = address
        self.image = image
        self.digest = hashlib.sha256(image).digest()
        self._ids = itertools.count(1)
        self._paths = itertools.cycle([True, False])  # direct, relay
        self.cases = 0
        self.reopened = 0
        self.resets = 0
        #: (op name, answered with success) -> count, over every answered call: the report
        #: at the end shows which ops the fuzz got through to their work, not only refused
        self.outcomes: collections.Counter[tuple[str, bool]] = collections.Counter()
        self.session: RawSession | None = None
        self.pool: Pool | None = None
        self.open()

    # ---- sessions and the pool ------------------------------------------------------------------
    def handle(self, kind: HandleKind) -> int:
        return (int(kind) << 56) | next(self._ids)

    def open(self) -> None:
        if self.session is not None:
            self.session.close()
        self.session = RawSession(self.address, direct=next(self._paths))
        self.reopened += 1
        self.cases_here = 0
        assert self.build(), "building the fuzz pool failed on a fresh session"

    def rebuild(self) -> None:
        """A new pool in this session, at another address if the fuzz mapped memory where
        the first attempts went; a new session if that keeps failing."""
        for _ in range(4):
            if self.build():
                return
        self.open()

    def build(self) -> bool:
        """Create the pool's objects with fresh handles and a fresh chunk address; False (and
        nothing left behind) if one of them could not be created."""
        s = self.session
        assert s is not None
        base, _size = s.window
        h = self.handle
        ctx, mod, fn = h(HandleKind.CONTEXT), h(HandleKind.MODULE), h(HandleKind.FUNCTION)
        stream, e0, e1 = h(HandleKind.STREAM), h(HandleKind.EVENT), h(HandleKind.EVENT)
        chunk = base + (1 + next(self._ids) % 10000) * 4 * CHUNK
        setup = [
            op_call("CTX_CREATE", ctx, 0),
            op_call("MEM_MAP_CHUNK", chunk, CHUNK),
            op_call("MEM_ALLOC", ctx, chunk, ALLOC),
            op_call("MEM_ALLOC", ctx, chunk + ALLOC, ALLOC),
            op_call("STREAM_CREATE", ctx, stream, 0, 0),
            op_call("EVENT_CREATE", ctx, e0, 0),
            op_call("EVENT_CREATE", ctx, e1, 0),
            op_call("MODULE_LOAD", ctx, mod, self.digest, data=self.image),
            op_call("FUNCTION_BIND", fn, mod, data=b"axpb"),
        ]
        replies = s.exchange(setup, CASE_TIMEOUT_S)
        load = replies[s.seq - 2]  # the module load's answer
        if any(r.result for r in replies.values()):
            cleanup = [op_call("CTX_DESTROY", ctx)]
            if not replies[s.seq - 8].result:  # the chunk was mapped
                cleanup.append(op_call("MEM_UNMAP_CHUNK", chunk))
            s.exchange(cleanup, CASE_TIMEOUT_S)
            return False
        var = json.loads(load.data)["globals"]["launches"][0]
        self.pool = Pool(ctx, chunk, chunk, chunk + ALLOC, mod, fn, stream, (e0, e1), var,
                         s.window, self.digest)  # fmt: skip
        return True

    def reset(self) -> None:
        """Destroy the pool's context (clearing a sticky fault) and chunk; build a new pool."""
        s, p = self.session, self.pool
        assert s is not None and p is not None
        self.resets += 1
        s.exchange([op_call("CTX_DESTROY", p.ctx), op_call("MEM_UNMAP_CHUNK", p.chunk)],
                   CASE_TIMEOUT_S)  # fmt: skip
        self.rebuild()

    # ---- cases ------------------------------------------------------------------------------
    def run(
        self, calls: list[tuple[int, bytes, bytes]], may_end: bool = False
    ) -> dict[int, guest_pb2.Reply] | None:
        """Send ``calls`` (and a synchronizing probe) as one batch, check the answers, restore
        the pool if the case hurt it. None when the session ended (allowed only if
        ``may_end``: the case closed its session)."""
        s = self.session
        assert s is not None
        s.packs = self.cases % 2 == 1  # every other case's small async calls as records
        try:
            replies = s.exchange(calls, CASE_TIMEOUT_S)
        except StreamEnded as e:
            if not may_end:
                raise AssertionError(
                    f"session {s.session_id} ({s.path}) ended on a case that did not close it: "
                    f"{e.why}; calls {describe(calls)}"
                ) from None
            self.open()
            return None
        self.check(calls, s.first, replies)
        self.after(calls, replies)
        return replies

    def check(
        self, calls: list[tuple[int, bytes, bytes]], first: int, replies: dict[int, guest_pb2.Reply]
    ) -> None:
        for i, (op_id, _, _) in enumerate(calls):
            op = OPS_BY_ID.get(op_id)
            r = replies.get(first + i)
            if op is not None and op.sync:
                assert r is not None, f"no answer to synchronous call #{i} of {describe(calls)}"
            if op is not None:  # an async call without a reply succeeded
                self.outcomes[(op.name, r is None or r.result == 0)] += 1
        for r in replies.values():
            assert r.result in _VALID, f"answer {r.result} is no CUDA result: {r}"
            assert r.result != CUresult.CUDA_ERROR_UNKNOWN, (
                f"CUDA_ERROR_UNKNOWN (an exception the worker did not expect): {r.detail}; "
                f"calls {describe(calls)}"
            )

    def after(
        self, calls: list[tuple[int, bytes, bytes]], replies: dict[int, guest_pb2.Reply]
    ) -> None:
        """Rebuild the pool when the case faulted the context or aimed a teardown at it;
        rotate the session now and then."""
        self.cases += 1
        self.cases_here += 1
        p = self.pool
        assert p is not None
        hurt = any(r.result in _STICKY for r in replies.values())
        for op_id, args, _ in calls:
            op = OPS_BY_ID.get(op_id)
            if op is None or op.name not in _TEARDOWN or len(args) < 8:
                continue
            (first_arg,) = struct.unpack_from("<Q", args)
            hurt = hurt or p.uses(first_arg)
        if self.cases_here >= ROTATE_AFTER:
            self.open()
        elif hurt:
            self.reset()

    def report(self) -> str:
        """Per op: calls that succeeded / calls answered."""
        names = sorted({name for name, _ in self.outcomes})
        return ", ".join(
            f"{n} {self.outcomes[(n, True)]}/{self.outcomes[(n, True)] + self.outcomes[(n, False)]}"
            for n in names
        )

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


def describe(calls: list[tuple[int, bytes, bytes]]) -> str:
    out = []
    for op_id, args, data in calls:
        op = OPS_BY_ID.get(op_id)
        name = op.name if op else f"op#{op_id}"
        try:
            values = op.unpack(args) if op else args.hex()
        except struct.error:
            values = f"bad args {args.hex()}"
        out.append(f"{name}{values} data={len(data)}B")
    return "; ".join(out)
