"""Audit records and their compact encoding on the audit topic (pure, no I/O).

One Kafka message on the audit topic carries many records: a msgpack array
`[version, cluster, [[kind, topic, group, producer_id, epoch, sequence, count, digest,
created_ms, ts_ms], ...]]`. Records are plain arrays, not maps, so a record costs ~40 bytes
and the emitter can buffer bare tuples in the same field order (no object per record on the
hot path). `AuditRecord` is a NamedTuple for the same reason: it *is* that tuple.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, NamedTuple, Sequence

import msgpack

from memq.errors import CorruptDataError, UnsupportedVersionError

AUDIT_FORMAT_VERSION = 1


class Kind(IntEnum):
    PRODUCED = 1   # the producer got the ack of a Message
    CONSUMED = 2   # the consumer handed a Message's last LogMessage to the application
    EXPIRED = 3    # retention deleted the topic's Messages created before `created_ms` (the janitor)
    ABORTED = 4    # a transaction was aborted: `count` LogMessages of the topic never became readable


class AuditRecord(NamedTuple):
    """One Message seen at one tier. `ts_ms` is the ack time (produced) or consume time."""

    kind: Kind
    topic: str
    group: str            # consumer group; "" for produced records
    producer_id: int
    epoch: int
    sequence: int
    count: int  # type: ignore[assignment]  # shadows tuple.count; LogMessages in the Message
    digest: int           # Message body CRC32C
    created_ms: int       # when the producer sealed the Message
    ts_ms: int

    @property
    def key(self) -> tuple[int, int, int]:
        """What identifies a Message across tiers: (producer id, epoch, sequence)."""
        return (self.producer_id, self.epoch, self.sequence)


_FIELDS = len(AuditRecord._fields)
_INT_FIELDS = range(3, _FIELDS)


def encode_records(cluster: str, rows: Sequence[Sequence[Any]]) -> bytes:
    """Encode records (AuditRecords or tuples in the same field order) as one payload."""
    return msgpack.packb([AUDIT_FORMAT_VERSION, cluster, rows], use_bin_type=True)


def decode_records(buf: bytes) -> tuple[str, list[AuditRecord]]:
    """Decode one audit payload into (cluster, records); bad bytes raise a typed error."""
    try:
        obj = msgpack.unpackb(buf, raw=False, use_list=True, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise CorruptDataError(f"audit payload of {len(buf)} bytes is not msgpack: {e}") from None
    if not (isinstance(obj, list) and len(obj) == 3 and isinstance(obj[0], int)):
        raise CorruptDataError("audit payload is not [version, cluster, records]")
    version, cluster, rows = obj
    if version > AUDIT_FORMAT_VERSION or version < 1:
        raise UnsupportedVersionError(
            f"audit payload version {version}; this reader knows up to {AUDIT_FORMAT_VERSION}")
    if not isinstance(cluster, str) or not isinstance(rows, list):
        raise CorruptDataError("audit payload: cluster must be a string and records a list")
    records = []
    for i, row in enumerate(rows):
        if not (isinstance(row, list) and len(row) == _FIELDS and isinstance(row[1], str)
                and isinstance(row[2], str)
                and all(type(row[j]) is int and row[j] >= 0 for j in _INT_FIELDS)):
            raise CorruptDataError(f"audit payload: record {i} has a bad shape: {row!r:.200}")
        try:
            kind = Kind(row[0])
        except ValueError:
            raise CorruptDataError(f"audit payload: record {i} has unknown kind {row[0]!r}") from None
        records.append(AuditRecord(kind, *row[1:]))
    return cluster, records
