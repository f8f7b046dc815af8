"""The pure parts of reading compacted topics: compaction's Kafka settings, compacted batches
placed in a Fetch, memq's Consumer's runs of a part's survivors, the keyless check, the
metadata's cleanup policy, and the chaos checker's rule for compacted topics (the latest value
per acked key survives)."""

from __future__ import annotations

import pytest

from memq.chaos.checker import KeyedWrite, check_compacted
from memq.client.compacted import PartRead, _decoded
from memq.compaction.parts import Survivor, encode_part
from memq.config import TopicConfig
from memq.errors import ConfigError
from memq.format.kafka_records import KafkaCodec, decode_kafka_entries, encode_kafka_batch, peek_kafka_batch
from memq.format.metadata import ClusterMetadata, StorageMetadata, TopicMetadata
from memq.kafka_api import topic_configs as tc
from memq.kafka_api.compacted import keyless_records, place_batch
from memq.kafka_api.offsets import first_offset, kafka_offset
from memq.kafka_api.topic_configs import AlterOp
from memq.log.model import PartSegment
from memq.storage import ObjectLocation

CLUSTER = "c1"


def test_compaction_settings_under_kafkas_names() -> None:
    cur = TopicConfig(name="t", read_partitions=1)
    got = {e.name: e.value for e in tc.describe(cur, CLUSTER)}
    assert got["cleanup.policy"] == "delete" and got["max.compaction.lag.ms"] == str(tc.NO_LAG_BOUND)
    changes = tc.assigned(cur, [("cleanup.policy", "delete, compact"), ("min.compaction.lag.ms", "1000"),
                                ("max.compaction.lag.ms", "60000"), ("delete.retention.ms", "5000"),
                                ("min.cleanable.dirty.ratio", "0.25")], CLUSTER)
    cfg = tc.altered(cur, changes)
    assert (cfg.cleanup_policy, cfg.min_compaction_lag_ms, cfg.max_compaction_lag_ms, cfg.delete_retention_ms,
            cfg.min_cleanable_dirty_ratio) == ("compact,delete", 1000, 60000, 5000, 0.25)
    assert tc.assigned(cfg, [("max.compaction.lag.ms", str(tc.NO_LAG_BOUND))], CLUSTER) == {
        "max_compaction_lag_ms": None}
    # cleanup.policy is Kafka's one list setting here: APPEND and SUBTRACT work on it
    assert tc.incremental(cur, [("cleanup.policy", AlterOp.APPEND, "compact")], CLUSTER) == {
        "cleanup_policy": "compact,delete"}
    assert tc.incremental(cfg, [("cleanup.policy", AlterOp.SUBTRACT, "delete")], CLUSTER) == {
        "cleanup_policy": "compact"}
    with pytest.raises(ConfigError, match="cleanup.policy=compact,shred"):
        tc.assigned(cur, [("cleanup.policy", "compact,shred")], CLUSTER)


def _batch(offsets: list[int], values: list[bytes | None], codec: KafkaCodec = KafkaCodec.NONE) -> bytes:
    survivors = [Survivor(o, 1000 + o, b"k%d" % o, v) for o, v in zip(offsets, values)]
    return encode_kafka_batch(survivors, codec, base_offset=offsets[0],   # type: ignore[arg-type]
                              deltas=[o - offsets[0] for o in offsets])


def test_a_compacted_batch_is_placed_as_stored_with_its_offsets() -> None:
    batch = _batch([first_offset(2) + 5, first_offset(3) + 1], [b"a", None], KafkaCodec.ZSTD)
    out = bytearray()
    after = place_batch(batch, out, 10**6, at_least_one=True, zstd=False)   # an old Fetch: no zstd
    assert after == first_offset(3) + 2
    placed = peek_kafka_batch(out)
    assert placed.base_offset == first_offset(2) + 5 and placed.codec is KafkaCodec.NONE
    assert bytes(out[12:16]) == b"\xff\xff\xff\xff"                        # leader epoch unknown
    entries = decode_kafka_entries(out)                                    # CRC still holds
    assert [(e.offset_delta, e.value) for e in entries] == [(0, b"a"), (first_offset(1) - 4, None)]
    assert place_batch(batch, out, len(out) + 10, at_least_one=True, zstd=True) is None   # no room left
    assert place_batch(batch, bytearray(), 10, at_least_one=True, zstd=True) is not None   # KIP-74


def test_keyless_records_are_counted() -> None:
    keyed = _batch([0, 1], [b"a", b"b"])
    records = [Survivor(0, 1, None, b"x"), Survivor(1, 1, b"k", b"y")]   # type: ignore[arg-type]
    keyless = encode_kafka_batch(records, KafkaCodec.GZIP)  # type: ignore[arg-type]
    assert keyless_records([keyed]) == 0 and keyless_records([keyed, keyless]) == 1


def test_metadata_carries_the_cleanup_policy() -> None:
    md = ClusterMetadata("c", "b1", "k:1", StorageMetadata(), topics={
        "t": TopicMetadata("t", "n", 1, cleanup_policy="compact"), "u": TopicMetadata("u", "n2", 1)})
    back = ClusterMetadata.from_dict(md.to_dict())
    assert back.topics["t"].cleanup_policy == "compact" and back.topics["u"].cleanup_policy == "delete"
    assert "cleanup_policy" not in md.to_dict()["topics"]["u"]                # older readers see nothing new


def _w(key: str, rid: str, sent: float, done: float, ok: bool = True, tombstone: bool = False) -> KeyedWrite:
    return KeyedWrite(key, rid, sent, done, ok, tombstone)


def test_checker_wants_the_latest_acked_value_per_key() -> None:
    writes = [_w("a", "a1", 0, 1), _w("a", "a2", 2, 3), _w("b", "b1", 0, 1), _w("b", "b2", 0.5, 4, tombstone=True),
              _w("c", "c1", 0, 1), _w("c", "c2", 0.5, 2), _w("d", "d1", 0, 1, ok=False)]
    # c1 overlapped c2 (sent before c2 was done): either may be last; b's latest is a tombstone: may be gone
    assert check_compacted(writes, {"a": "a2", "c": "c1"}).passed
    v = check_compacted(writes, {"a": "a1", "c": "c2", "b": "b1", "x": "x1"})
    assert v.lost == ("a",) and v.unknown == ("x",) and not v.passed and v.keys == 3
    assert check_compacted(writes, {"c": "c2"}).lost == ("a",)                  # a's value is gone
    assert check_compacted(writes, {"a": "a2", "c": "c1", "b": "b1"}).lost == ()   # b1 overlapped the tombstone


def test_the_consumer_hands_a_parts_survivors_over_in_runs_of_one_notification_from_its_segment_start() -> None:
    """memq's Consumer reads a compacted part as the partition log's segment names it: survivors
    from the segment's start, one run per stretch of consecutive offsets of one notification, each
    at its (notification, index) position, its producer id told apart per partition."""
    offsets = [kafka_offset(2, 0), kafka_offset(2, 1), kafka_offset(2, 3), kafka_offset(3, 0), kafka_offset(3, 1)]
    enc = encode_part([Survivor(o, 7, b"k%d" % i, b"v%d" % i) for i, o in enumerate(offsets)], broker_id="t",
                      created_ms=1)
    obj = b"".join(bytes(c) for c in enc.chunks)[:enc.size]
    part = enc.ref(ObjectLocation("b", "p"))
    read = PartRead(1, PartSegment(part, kafka_offset(2, 1), first_offset(4), 2, 3))
    assert (read.offset, read.size, read.timestamp_ms) == (3, enc.size, 7)
    runs = _decoded("t", read, False, obj)
    assert [(r.head, r.first, [v for v, *_ in r.logs]) for _, r in runs] == [
        (("t", 1, 2), 1, [b"v1"]), (("t", 1, 2), 3, [b"v2"]), (("t", 1, 3), 0, [b"v3", b"v4"])]
    assert [h.sequence for h, _ in runs] == [kafka_offset(2, 1), kafka_offset(2, 3), kafka_offset(3, 0)]
    assert len({h.producer_id for h, _ in runs}) == 1 and runs[0][0].producer_id != 0   # partition 1's id


def test_a_dense_parts_survivors_are_handed_over_at_their_record_offsets() -> None:
    """On a dense topic a survivor's offset is its record offset, its index its place among the
    part's survivors; a run is a stretch of consecutive offsets, whatever its notifications."""
    offsets = [40, 41, 43, 44, 45]
    enc = encode_part([Survivor(o, 7, b"k%d" % i, b"v%d" % i) for i, o in enumerate(offsets)], broker_id="t",
                      created_ms=1)
    obj = b"".join(bytes(c) for c in enc.chunks)[:enc.size]
    read = PartRead(0, PartSegment(enc.ref(ObjectLocation("b", "p")), 41, 50, 2, 3))
    runs = _decoded("t", read, True, obj)
    assert [[(r.offset, r.index, r.value) for r in records] for _, records in runs] == [
        [(41, 1, b"v1")], [(43, 2, b"v2"), (44, 3, b"v3"), (45, 4, b"v4")]]
    assert [h.sequence for h, _ in runs] == [41, 43]
