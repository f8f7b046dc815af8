"""Compile the Spark decode's numba kernels once, before the suite's processes start.

numba compiles a kernel on its first call in a process and caches it beside the module for
the next; in a fresh checkout every Spark worker and test process starting before the cache
exists compiled them again (3-8 s each, seen as ~+1 min of the suite). Decoding one small
object of every span-backed codec here, and walking one Avro payload (the brokers' check),
one flat Avro record and one Protobuf message (typed reads), compiles each kernel once and
writes the cache.
"""

from __future__ import annotations

import json

import fastavro
import numpy as np

from memq.format import Codec, LogMessage, decode_message_header, encode_batch, encode_message
from memq.format.arrow_body import COLUMNS
from memq.format.columns import concat_column, decode_batch_columns
from memq.format.kafka_records import verify_kafka_batch
from memq.format.message import encode_kafka_message
from tests.support.kafka_frames import record_batch


def warm() -> None:
    recs = [LogMessage(b"v" * 300, b"k" if i % 2 else None, (("h", b"x"),), 1_000 + i, b"id") for i in range(4)]
    kb = record_batch(recs, codec="zstd", producer_id=1, epoch=0, base_sequence=0)
    msgs = [encode_message(recs, producer_id=1, epoch=0, sequence=s, codec=Codec.ZSTD) for s in range(2)] + \
           [encode_kafka_message(kb, verify_kafka_batch(kb), producer_id=1, epoch=0, sequence=2 + s)[0] for s in range(2)]
    obj = b"".join(encode_batch(msgs, [decode_message_header(m) for m in msgs], broker_id="warm"))
    _, decoded = decode_batch_columns(obj)
    for parts in ([c for _, c in decoded[:2]], [c for _, c in decoded[2:]]):
        for name in COLUMNS:
            concat_column(parts, name)

    from memq.schema import avro_walk
    named: dict[str, object] = {}
    parsed = fastavro.parse_schema({"type": "record", "name": "W", "fields": [{"name": "s", "type": "string"}]},
                                   named_schemas=named)
    avro_walk.walk(np.frombuffer(b"\x02x", dtype=np.uint8), np.array([0, 2], dtype=np.int64), 0,
                   avro_walk.program(parsed, named))

    try:
        from spark_source.avro_walk import flat_plan, walk   # imports pyspark: only in the controller, once
    except ImportError:   # no Spark extra, no typed reads to warm
        return
    plan = flat_plan(json.dumps({"type": "record", "name": "W", "fields": [{"name": "n", "type": "long"}]}))
    assert plan is not None   # typed reads' walk of flat Avro records (spark_source.avro_walk)
    walk(plan, b"\x02", np.array([0]), np.array([1]))

    from google.protobuf import descriptor_pb2, descriptor_pool

    from spark_source import proto_walk   # typed reads' walk of proto3 messages
    fdp = descriptor_pb2.FileDescriptorProto(name="warm.proto", package="warm", syntax="proto3")
    fdp.message_type.add(name="W").field.add(name="n", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
                                             label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    proto = proto_walk.proto_plan(pool.FindMessageTypeByName("warm.W"), "proto3")
    assert proto is not None
    proto_walk.walk(proto, b"\0\x08\x01", np.array([0]), np.array([3]))

