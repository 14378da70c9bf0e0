"""``CallBatch.flags`` read from a serialized batch's first bytes, without parsing it.

The daemon relays batches without decoding them (invariant 4), yet must know whether to wait
for the worker's answer: a batch of asynchronous calls is forwarded and forgotten (so bulk
copies pipeline), a batch with a synchronizing call is followed by its replies. ``flags`` is
field 1, which protobuf serializers write first; the daemon and the worker both decide from
these same bytes with this same function, so they always agree, even on a malformed batch.
"""

from __future__ import annotations

__all__ = ["EXPECTS_REPLY", "SHORT_ANSWER", "peek_flags"]

EXPECTS_REPLY = 0x1
#: The guest reads the short form of an answer (``ReplyBatch.answer``, crane.wire.replies).
SHORT_ANSWER = 0x2


def peek_flags(raw: bytes | memoryview) -> int:
    """Flags of a serialized CallBatch (0 when absent or not encoded first)."""
    if len(raw) < 2 or raw[0] != 0x08:  # field 1, wire type varint
        return 0
    if raw[1] < 0x80:  # a one-byte varint: every flag the guest sets today
        return raw[1]
    value = shift = 0
    for i in range(1, min(len(raw), 6)):
        b = raw[i]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value
        shift += 7
    return 0
