"""The Spark source's rows from Codec.ARROW Messages, without Spark or servers: the stored
columns give the same table as a msgpack body of the same records, in any mix."""

from __future__ import annotations

from memq.format import Codec, Compressors, LogMessage, encode_message
from memq.format.columns import decode_message_columns
from spark_source.schema import ARROW_SCHEMA, BatchContext, to_record_batch


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
