"""Hand-encoded ``ReplyBatch`` messages: the reply that carries bulk data, and the short answer.

Building a protobuf message around a multi-megabyte ``bytes`` field copies the payload three
times (into the field, into the message, out of it when serialized). :func:`encode_data_reply`
writes the same wire bytes directly, with one copy from device memory.

A synchronizing call's answer is nearly always "done, result 0": building, serializing and
parsing a ``ReplyBatch`` and its ``Reply`` for that cost the worker and the guest about 3 us
of a 10 us round trip on the call ring. When the guest asks for it (``SHORT_ANSWER`` in the
batch's flags) and the answer is one call's result code with no detail, its fixed-size results
at most, and nothing else (no other reply, no device output), the worker sends
``ReplyBatch{answer}`` instead: :data:`ANSWER` (seq, done_seq, result) then the results, one
``struct`` each way (:func:`encode_answer`, :func:`decode_answer`). Both are plain protobuf
(field numbers from proto/crane/v1/guest.proto); tests check them against the generated
serializer byte for byte.
"""

from __future__ import annotations

import struct

from crane.v1 import guest_pb2

__all__ = ["ANSWER", "as_message", "decode_answer", "encode_answer", "encode_data_reply"]

#: The short answer's fixed part: seq, done_seq, result (the op's results follow).
ANSWER = struct.Struct("<QQi")
_ANSWER_TAG = 0x22  # ReplyBatch.answer: field 4, length-delimited
#: Results a short answer may carry (every op that travels as a record has fewer).
ANSWER_OUT_MAX = 0x7F - ANSWER.size


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


def encode_answer(seq: int, result: int, out: bytes, done_seq: int) -> bytes:
    """Serialized ``ReplyBatch{answer}``: one call's answer (``out``: at most
    :data:`ANSWER_OUT_MAX` bytes of results) and how far the session ran."""
    body = ANSWER.pack(seq, done_seq, result) + out
    return bytes((_ANSWER_TAG, len(body))) + body


def decode_answer(raw: bytes) -> tuple[int, int, int, bytes] | None:
    """``(seq, done_seq, result, out)`` of a serialized ``ReplyBatch`` that is a short answer
    and nothing else (the worker never sets ``answer`` beside another field), else None."""
    if len(raw) < 2 + ANSWER.size or raw[0] != _ANSWER_TAG or raw[1] != len(raw) - 2:
        return None
    seq, done, result = ANSWER.unpack_from(raw, 2)
    return seq, done, result, raw[2 + ANSWER.size :]


def as_message(raw: bytes) -> guest_pb2.ReplyBatch:
    """A serialized ``ReplyBatch`` parsed, a short answer as the message it stands for (for
    readers that want messages: tools and tests; the guest reads short answers as such)."""
    short = decode_answer(raw)
    if short is None:
        return guest_pb2.ReplyBatch.FromString(raw)
    seq, done, result, out = short
    reply = guest_pb2.Reply(seq=seq, result=result, out=out)
    return guest_pb2.ReplyBatch(replies=[reply], done_seq=done)


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
