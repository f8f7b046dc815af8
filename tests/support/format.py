"""memq.format test data: LogMessages (fixed, and a hypothesis strategy) and Messages with
rewritten header fields that still carry valid CRCs (valid-looking lies for the decoders)."""

from __future__ import annotations

import struct

from crc32c import crc32c
from hypothesis import strategies as st

from memq.format import MESSAGE_HEADER_SIZE, LogMessage
from memq.format.message import _HEADER

I64 = st.integers(-(2**63), 2**63 - 1)

log_messages = st.builds(
    LogMessage,
    value=st.binary(max_size=64),
    key=st.none() | st.binary(max_size=16),
    headers=st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)),
                     max_size=3).map(tuple),
    timestamp_ms=I64,
    message_id=st.none() | st.binary(max_size=16),
)


def records(n: int = 5, base: int = 1_000) -> list[LogMessage]:
    return [LogMessage(b"value-%d" % i, b"k%d" % i if i % 2 else None, (("h", b"%d" % i),),
                       base + i, b"id%d" % i if i % 3 else None) for i in range(n)]


def reheader(msg: bytes, **changes: int) -> bytes:
    """Rewrite Message header fields and re-seal the header CRC (valid-looking lies)."""
    names = ["magic", "version", "codec", "header_size", "producer_id", "epoch", "sequence",
             "count", "lo", "hi", "created", "body_length", "raw_length", "body_crc", "crc"]
    fields = dict(zip(names, _HEADER.unpack_from(msg)))
    fields.update(changes)
    head = _HEADER.pack(*fields.values())[:-4]
    return head + struct.pack("<I", crc32c(head)) + msg[MESSAGE_HEADER_SIZE:]


def rebody(msg: bytes, body: bytes, **changes: int) -> bytes:
    """Replace the body, with a correct body CRC and length unless overridden."""
    fields = {"body_length": len(body), "body_crc": crc32c(body), **changes}
    return reheader(msg[:MESSAGE_HEADER_SIZE] + body, **fields)
