"""Kafka's admin messages, every version, through kafka-python's codec of Kafka's own schemas.

The admin APIs (topics, configs, ACLs, cluster, records) are many messages of many versions,
flexible and not, and none is on a hot path: rather than a hand-written codec per message,
kafka-python's classes (`kafka.protocol.admin` and friends, generated from Kafka's
`clients/src/main/resources/common/message/*.json`) decode the request body and encode the
response body. This module adds what a server needs around them: the flexible request
header's tags, the response header, and one error type for bad bytes (`ProtocolError`).
"""

from __future__ import annotations

import struct
from typing import Any

from memq.errors import ProtocolError

from .flexible import flex_body
from .protocol import Reader, RequestHeader

_I32 = struct.Struct(">i")


def decode_request(cls: Any, h: RequestHeader, body: Reader) -> Any:
    """Request `cls` (a kafka-python request class) at the header's version, read from `body`
    (just past the request header's client id); ProtocolError on bytes that do not parse."""
    if not 0 <= h.api_version <= cls.max_version:
        raise ProtocolError(f"{cls.name} version {h.api_version} is not known")
    pos = flex_body(body).pos if cls.flexible_version_q(h.api_version) else body.pos
    try:
        return cls.decode(bytes(body.buf[pos:]), version=h.api_version)
    except Exception as e:   # kafka-python raises struct, value, index and its own errors on bad bytes
        raise ProtocolError(f"{cls.name} v{h.api_version} does not parse: {type(e).__name__}: {e}") from None


def encode_response(h: RequestHeader, response: Any) -> bytes:
    """`response` (a kafka-python response object) at the request's version, framed: size,
    correlation id, and the empty header tags of a flexible version (response header v1)."""
    body = response.encode(version=h.api_version)
    flexible = type(response).flexible_version_q(h.api_version)
    head = _I32.pack(h.correlation_id) + (b"\0" if flexible else b"")
    return _I32.pack(len(head) + len(body)) + head + bytes(body)
