"""Notification: the JSON pointer to a stored batch that goes to Kafka, versioned by "v".

A notification names one *part* of an object: the batch at bytes [offset, offset + size) of
the object `key`, whose CRC32C is `crc32c`. An object of one topic is the one-part case at
offset 0; a storage group's object holds one part per topic (see `memq.broker.storage_group`).
Versions: 1 had no `offset` (always 0, read as such); 2 added it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from typing import Any

from memq.errors import CorruptDataError, UnsupportedVersionError

NOTIFICATION_VERSION = 2
_ENCODER = json.JSONEncoder(separators=(",", ":"))


@dataclass(frozen=True)
class Notification:
    v: int
    topic: str
    bucket: str
    key: str
    size: int                # of the part (the batch)
    header_size: int
    message_count: int
    logmessage_count: int
    min_timestamp_ms: int
    max_timestamp_ms: int
    crc32c: int              # over the part's bytes
    broker_id: str
    attempt: int
    created_ms: int
    offset: int = 0          # where the part starts in the object (v2; v1 objects held one part)

    @functools.cached_property
    def _encoded(self) -> bytes:
        # vars(), not dataclasses.asdict(): the fields are flat, and asdict's deep copy was
        # a third of the publisher's time; one encoder, not json.dumps' new one per call.
        # Computed before it is cached, so vars() holds the fields alone.
        return _ENCODER.encode(vars(self)).encode()

    def to_bytes(self) -> bytes:
        """The JSON bytes, encoded once: the publisher sends them and the broker counts them."""
        return self._encoded

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Notification:
        """Parse and type-check; UnsupportedVersionError if written by a newer memq."""
        try:
            obj = json.loads(bytes(data))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise CorruptDataError(f"notification is not JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise CorruptDataError(f"notification is a JSON {type(obj).__name__}, not an object")
        v = obj.get("v")
        if type(v) is not int or v < 1:
            raise CorruptDataError(f"notification field 'v' is {v!r}, want a positive int")
        if v > NOTIFICATION_VERSION:
            raise UnsupportedVersionError(
                f"notification version {v}, this reader knows up to {NOTIFICATION_VERSION}")
        if v == 1:
            obj = {**obj, "offset": 0}
        return cls(**{f.name: _field(obj, f.name, _TYPES[f.name]) for f in _FIELDS})


_FIELDS = dataclasses.fields(Notification)
_TYPES: dict[str, type] = {f.name: (str if f.type == "str" else int) for f in _FIELDS}


def _field(obj: dict[str, Any], name: str, kind: type) -> Any:
    if name not in obj:
        raise CorruptDataError(f"notification lacks field {name!r}")
    value = obj[name]
    # bool is an int subclass; JSON true must not pass as a count. Timestamps (i64 in the
    # batch) may be negative; sizes, counts, checksum and attempt may not.
    if kind is str:
        if type(value) is str:
            return value
        want = "string"
    elif name.endswith("_ms"):
        if type(value) is int:
            return value
        want = "int"
    else:
        if type(value) is int and value >= 0:
            return value
        want = "non-negative int"
    raise CorruptDataError(f"notification field {name!r} is {value!r}, want a {want}")
