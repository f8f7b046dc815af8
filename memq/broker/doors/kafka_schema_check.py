"""The Kafka door's produce-time schema checks (a topic with `value_schema_validation` or
`key_schema_validation`; memq.schema.check through the admission path).

`check_partition` reads the keys and values of a partition's verified RecordBatches (only them:
`kafka_fields`, no LogMessage built), asks `Admission.check_records`,
and by the topic's `schema_validation_action`:
- `reject`: a failing record refuses the partition (INVALID_RECORD, `record_errors` giving each
  failing record's index among the partition's records and why); nothing of it is stored.
- `warn`: everything goes on (the admission path counted the failures).
- `dlq`: the failing records go first, as one RecordBatch, to `<topic>.dlq` through the same
  admission path (the principal needs `produce` there; the topic must be hosted on this broker)
  with headers `memq.dlq.reason`, `memq.dlq.schema.id`, `memq.dlq.topic`, `memq.dlq.partition`
  and `memq.dlq.index` (the record's index among the partition's records: a refused record has no
  offset); once they are stored, the partition goes on with its other records, each batch that
  held a failing one framed again without it under the batch's producer ids (a retry is framed
  the same, so the dedup of idempotent producers holds in both topics). If the dead-letter topic
  cannot take them, the partition is refused as under `reject`: no record is ever dropped.
"""

from __future__ import annotations

import dataclasses

from memq.errors import FormatError, MemqError
from memq.format import LogMessage
from memq.format.kafka_records import (KafkaBatchHeader, decode_kafka_records, encode_kafka_batch, kafka_fields,
                                       verify_kafka_batch)
from memq.format.message import encode_kafka_message
from memq.kafka_api.mapping import memq_producer_id
from memq.kafka_api.protocol import ErrorCode, PartitionResult
from memq.schema.check import Failure, Fields, dead_letters

from ..admission import Ticket
from .kafka_family import Conn

#: A refused Produce lists at most this many records' errors (the message counts them all).
MAX_RECORD_ERRORS = 100

Batches = list[tuple[memoryview, KafkaBatchHeader]]


async def check_partition(conn: Conn, topic: str, index: int, ticket: Ticket, batches: Batches,
                          ids: tuple[int, int, int]) -> PartitionResult | Batches:
    """The partition's answer when it is refused, else the batches to store (`batches` itself,
    or under `dlq` those with failing records framed again without them: maybe none). `ids`:
    (producer id, sequence, request id) a non-idempotent producer's dead letters are stored under."""
    try:
        per_batch = [kafka_fields(b) for b, _ in batches]
    except FormatError as e:
        return PartitionResult(index, ErrorCode.CORRUPT_MESSAGE, message=str(e))
    fields = Fields([k for f in per_batch for k in f.keys], [v for f in per_batch for v in f.values]) \
        if len(per_batch) > 1 else Fields(*per_batch[0])
    try:
        failures = await conn.core.admission.check_records(ticket, fields)
    except MemqError as e:   # the registry's store cannot answer (ZooKeeper away): retriable, nothing stored
        return PartitionResult(index, ErrorCode.REQUEST_TIMED_OUT, message=f"topic {topic}: schema checks: {e}")
    action = ticket.config.schema_validation_action
    if not failures or action == "warn":
        return batches
    if action == "dlq":   # the rare path: the records decoded whole, headers and all
        per_records = [decode_kafka_records(b) for b, _ in batches]   # kafka_fields read them: they decode
        records = [r for rs in per_records for r in rs]
        why = await _dead_letters(conn, topic, index, batches, records, failures, ids)
        if why is None:
            return _without(batches, per_records, {f.index for f in failures})
        extra = f"; the dead-letter topic cannot take them: {why}"
    else:
        extra = ""
    return PartitionResult(index, ErrorCode.INVALID_RECORD, record_errors=tuple(
        (f.index, str(f)) for f in failures[:MAX_RECORD_ERRORS]),
        message=f"topic {topic}: {len(failures)} of {len(fields)} records fail the schema checks; "
                f"first: {failures[0]}{extra}")


async def _dead_letters(conn: Conn, topic: str, index: int, batches: Batches, records: list[LogMessage],
                        failures: list[Failure], ids: tuple[int, int, int]) -> str | None:
    """Store the failing records in the dead-letter topic; None once stored, else why not."""
    batch = encode_kafka_batch(dead_letters(records, failures, topic, index))
    kh = verify_kafka_batch(batch)
    first = batches[0][1]
    producer_id, epoch, sequence = ids[0], 0, ids[1]
    if first.producer_id >= 0:   # idempotent: the source batch's ids, so a retry is dropped as a duplicate
        producer_id, epoch = memq_producer_id(first.producer_id, index), max(first.producer_epoch, 0)
        sequence = first.base_sequence
    msg, header = encode_kafka_message(batch, kh, producer_id=producer_id, epoch=epoch, sequence=sequence)
    return await conn.core.admission.dead_letter(conn.principal, topic, memoryview(msg), header, ids[2])


def _without(batches: Batches, per_batch: list[list[LogMessage]], failed: set[int]) -> Batches:
    """`batches` with the failed records (indexes over all their records) left out: a batch
    holding none stays as it came; one holding some is framed again with the rest, under its
    producer ids; one holding only failed records is dropped."""
    out: Batches = []
    start = 0
    for (b, kh), rs in zip(batches, per_batch):
        keep = [r for i, r in enumerate(rs, start) if i not in failed]
        start += len(rs)
        if len(keep) == len(rs):
            out.append((b, kh))
        elif keep:
            again = encode_kafka_batch(keep)
            out.append((memoryview(again), dataclasses.replace(
                verify_kafka_batch(again), producer_id=kh.producer_id, producer_epoch=kh.producer_epoch,
                base_sequence=kh.base_sequence)))
    return out
