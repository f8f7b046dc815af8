"""Notification: the JSON pointer to a stored batch that goes to Kafka, versioned by "v"."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from memq.errors import CorruptDataError, UnsupportedVersionError

NOTIFICATION_VERSION = 1


@dataclass(frozen=True)
class Notification:
    v: int
    topic: str
    bucket: str
    key: str
    size: int
    header_size: int
    message_count: int
    logmessage_count: int
    min_timestamp_ms: int
    max_timestamp_ms: int
    crc32c: int  # over the whole object
    broker_id: str
    attempt: int
    created_ms: int

    def to_bytes(self) -> bytes:
        # vars(), not dataclasses.asdict(): the fields are flat, and asdict's deep copy was
        # a third of the publisher's time.
        return json.dumps(vars(self), separators=(",", ":")).encode()

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
