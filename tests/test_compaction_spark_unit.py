"""The Spark source's pure parts for compacted topics: which parts a notification range reads,
where a compacted partition starts, and a part's rows with the offsets of the records as produced."""

from __future__ import annotations

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from memq.compaction.manifest import Manifest  # noqa: E402
from memq.compaction.parts import Survivor, encode_part  # noqa: E402
from memq.config import MemqConfig  # noqa: E402
from memq.kafka_api.offsets import first_offset, kafka_offset  # noqa: E402
from memq.storage import ObjectLocation  # noqa: E402
from spark_source.compacted import decode_part, earliest, part_refs, part_rows  # noqa: E402
from spark_source.options import SourceOptions  # noqa: E402
from spark_source.plan import BatchRef  # noqa: E402
from spark_source.schema import ARROW_SCHEMA  # noqa: E402


def _manifest() -> Manifest:
    """Two parts: survivors of notifications 0-1, then 3-4; the tail at notification 6."""
    parts = []
    for n, (lo, hi) in enumerate([(0, 2), (3, 5)]):
        survivors = [Survivor(kafka_offset(note, 1), 5, b"k%d" % note, b"v") for note in range(lo, hi)]
        parts.append(encode_part(survivors, broker_id="t", created_ms=1).ref(ObjectLocation("b", f"p{n}")))
    return Manifest("t", 0, 6, 1, 1, tuple(parts))


def test_a_range_reads_the_parts_holding_its_survivors() -> None:
    m = _manifest()
    refs = part_refs(m, 0, 0, 6)
    assert [(r.location.key, r.offset, r.kafka_range) for r in refs] == [
        ("p0", 0, (0, first_offset(6))), ("p1", 3, (0, first_offset(6)))]
    assert [(r.location.key, r.offset) for r in part_refs(m, 0, 1, 6)] == [("p0", 1), ("p1", 3)]
    assert [r.location.key for r in part_refs(m, 0, 2, 3)] == []               # compacted away
    assert [(r.location.key, r.kafka_range) for r in part_refs(m, 0, 4, 9)] == [("p1", (first_offset(4),
                                                                                        first_offset(6)))]
    assert [r.location.key for r in part_refs(m, 0, 0, 3)] == ["p0"]
    assert earliest({0: 4, 1: 7}, {0: m}) == {0: 0, 1: 7}


def test_a_parts_rows_carry_their_own_offset_and_index_and_tombstones_read_null() -> None:
    survivors = [Survivor(kafka_offset(2, 7), 100, b"a", b"1", (("h", b"x"),)), Survivor(kafka_offset(2, 9), 101, b"b", None),
                 Survivor(kafka_offset(5, 0), 102, b"c", b"3")]
    enc = encode_part(survivors, broker_id="t", created_ms=1, records_per_batch=2)
    obj = b"".join(bytes(c) for c in enc.chunks)[:enc.size]
    loc = ObjectLocation("b", "part")
    ref = BatchRef(0, 2, loc, enc.size, kafka_range=(kafka_offset(2, 8), first_offset(6)))
    opts = SourceOptions("t", "n", MemqConfig())
    batch = part_rows(opts, ARROW_SCHEMA, ref, None, None, decode_part(obj))
    rows = pa.Table.from_batches([batch]).to_pylist()
    assert [(r["offset"], r["index"], r["key"], r["value"], r["partition"]) for r in rows] == [
        (2, 9, b"b", None, 0), (5, 0, b"c", b"3", 0)]
    assert len({(r["producerId"], r["sequence"], r["messageIndex"]) for r in rows}) == 2
    everything = part_rows(opts, ARROW_SCHEMA, BatchRef(0, 2, loc, enc.size, kafka_range=(0, first_offset(6))),
                           None, 102, decode_part(obj))                          # and cut by time
    assert [(r["key"], r["headers"]) for r in everything.to_pylist()] == [(b"a", [{"key": "h", "value": b"x"}]),
                                                                         (b"b", [])]
