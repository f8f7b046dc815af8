"""The Spark source's rows from Codec.ARROW Messages, without Spark or servers: the stored
columns give the same table as a msgpack body of the same records, in any mix."""

from __future__ import annotations

from pyspark.sql.types import BinaryType, StructField, StructType

from memq.format import Codec, Compressors, LogMessage, decode_message_header, encode_batch, encode_message
from memq.format.columns import decode_batch_columns, decode_message_columns
from memq.format.kafka_records import verify_kafka_batch
from memq.format.message import encode_kafka_message
from spark_source.schema import ARROW_SCHEMA, BatchContext, projection, to_record_batch
from tests.support.kafka_frames import record_batch

READ = StructType([StructField("value", BinaryType())])


def decoded(codec: Codec, seq: int, n: int) -> tuple:
    logs = [LogMessage(b"v%d" % i, b"k" if i % 2 else None, (("h", b"%d" % i),) * (i % 3), 1_000 + i,
                       b"id" if i % 4 else None) for i in range(n)]
    return decode_message_columns(encode_message(logs, producer_id=9, epoch=1, sequence=seq, codec=codec),
                                  Compressors())


def test_arrow_messages_read_as_the_same_rows_as_msgpack_ones() -> None:
    ctx = BatchContext("t", 1, 5, "b", "k")
    msgpack_only = [decoded(Codec.ZSTD, s, n) for s, n in enumerate((3, 0, 4))]
    mixed = [decoded(c, s, n) for s, (c, n) in enumerate(((Codec.ARROW, 3), (Codec.ARROW, 0), (Codec.ZSTD, 4)))]
    want = to_record_batch(ctx, msgpack_only, keep=[True, True, False], start_ms=1_001)
    got = to_record_batch(ctx, mixed, keep=[True, True, False], start_ms=1_001)
    assert got.schema == ARROW_SCHEMA and got.equals(want) and got.num_rows == 2
    assert [h for h, _ in mixed][0].codec is Codec.ARROW
    assert to_record_batch(ctx, mixed).to_pylist() == to_record_batch(ctx, msgpack_only).to_pylist()


def test_an_object_of_every_codec_reads_as_its_records_in_any_projection() -> None:
    """Kafka and msgpack Messages gathered straight into the object's columns, with Arrow
    Messages in the mix or not: the records, Kafka's null keys kept and null values empty."""
    logs = [LogMessage(b"" if i % 4 == 0 else b"v%d" % i, None if i % 2 else b"k%d" % i, (("h", b"%d" % i),) * (i % 2),
                       2_000 + i) for i in range(6)]
    kb = record_batch([r._replace(value=None) if i == 0 else r for i, r in enumerate(logs)], codec="zstd")
    kafka = encode_kafka_message(kb, verify_kafka_batch(kb), producer_id=9, epoch=1, sequence=7)[0]
    for codecs in ((Codec.ZSTD, Codec.NONE), (Codec.ZSTD, Codec.ARROW)):
        msgs = [encode_message(logs, producer_id=9, epoch=1, sequence=s, codec=c) for s, c in enumerate(codecs)]
        msgs.insert(1, kafka)
        obj = b"".join(encode_batch(msgs, [decode_message_header(m) for m in msgs], broker_id="b"))
        got = to_record_batch(BatchContext("t", 1, 5, "b", "k"), decode_batch_columns(obj)[1], start_ms=2_001)
        want = [r for r in logs if r.timestamp_ms >= 2_001] * 3
        assert got.column("key").to_pylist() == [r.key for r in want]
        assert got.column("value").to_pylist() == [r.value for r in want]
        assert got.column("headers").to_pylist() == [[{"key": k, "value": v} for k, v in r.headers] for r in want]
        assert got.column("timestamp").cast("int64").to_pylist() == [r.timestamp_ms * 1000 for r in want]
        some = to_record_batch(BatchContext("t", 1, 5, "b", "k"),
                               decode_batch_columns(obj, fields={"value"})[1], schema=projection(READ))
        assert some.schema.names == ["value"] and some.column("value").to_pylist() == [r.value for r in logs] * 3
