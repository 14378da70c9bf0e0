"""Hand-encoded ``ReplyBatch`` for the one reply that carries bulk data (device-to-host reads).

Building a protobuf message around a multi-megabyte ``bytes`` field copies the payload three
times (into the field, into the message, out of it when serialized). This writes the same wire
bytes directly, with one copy from device memory. The encoding is plain protobuf (field numbers
from proto/crane/v1/guest.proto); tests check it against the generated serializer byte for byte.
"""

from __future__ import annotations

__all__ = ["encode_data_reply"]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_data_reply(seq: int, data: bytes | memoryview, done_seq: int) -> bytes:
    """Serialized ``ReplyBatch{replies: [Reply{seq, result: 0, data}], done_seq}``."""
    n = len(data) if not isinstance(data, memoryview) else data.nbytes
    head = b"\x08" + _varint(seq)  # Reply.seq (field 1, varint)
    if n:
        head += b"\x22" + _varint(n)  # Reply.data (field 4, length-delimited)
    reply_len = len(head) + n
    batch_head = b"\x0a" + _varint(reply_len)  # ReplyBatch.replies (field 1)
    tail = b"\x10" + _varint(done_seq) if done_seq else b""  # ReplyBatch.done_seq (field 2)
    return b"".join((batch_head, head, data, tail))
