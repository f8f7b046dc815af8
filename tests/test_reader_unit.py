"""The Consumer's bookkeeping and the batch reader, with in-process fakes: no server, no process."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from tests.support.consumer_fakes import FakeNotifications, MemorySource, batch, recs, values

from memq.client.consumer import Consumer
from memq.client.positions import Offsets
from memq.client.reader import BatchPointer, BatchReader, DataLossPolicy, read_in_order
from memq.config import ConsumerConfig, MemqConfig
from memq.errors import DataLossError
from memq.notify import NotificationRecord
from memq.storage import ObjectLocation




# --- pure bookkeeping --------------------------------------------------------------------------


def test_offsets_commit_only_what_was_handed_and_not_yet_committed() -> None:
    o = Offsets()
    o.fetched(0, 4)
    o.fetched(1, 9)
    assert o.to_commit() == {}
    o.finished(0, 4)
    o.finished(1, 9)
    assert o.to_commit() == {0: 5, 1: 10}
    o.did_commit({0: 5})
    assert o.to_commit() == {1: 10} and o.to_commit([0]) == {}
    o.forget([1])
    assert o.to_commit() == {} and 1 not in o.fetched_to


def test_position_prefers_pending_batches_then_fetched_then_kafka() -> None:
    o = Offsets()
    o.fetched(0, 7)          # read notifications up to 7
    o.sought(2, 3)           # sought, nothing read yet
    pos = o.position({0: 2, 1: 5, 3: None}, assignment=[0, 1, 2, 3], pending=[(0, 5), (0, 6)])
    assert pos == {0: 5, 1: 5, 2: 3}


def test_data_loss_policy_raises_with_hint_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    e = BatchPointer("t", ObjectLocation("b", "k"), partition=1, offset=2).lost("is missing: gone")
    assert (e.topic, e.partition, e.offset, e.location) == ("t", 1, 2, "k") and "b/k" in str(e)
    with pytest.raises(DataLossError) as raised:
        DataLossPolicy(skip=False, logger=logging.getLogger("x"), hint="set skip").handle(e)
    assert raised.value.__notes__ == ["set skip"]
    with caplog.at_level(logging.WARNING, logger="y"):
        DataLossPolicy(skip=True, logger=logging.getLogger("y"), hint="").handle(e)
    assert "b/k" in caplog.text


# --- the Consumer over the fakes (tests/support/consumer_fakes.py) ----------------------------


def consumer(records: list[NotificationRecord], objects: dict[str, bytes],
             **cc: Any) -> tuple[Consumer, FakeNotifications]:
    config = MemqConfig(consumer=ConsumerConfig(**cc))
    notes = FakeNotifications(records)
    reader = BatchReader(config, 2, source=lambda: MemorySource(objects))
    return Consumer(config, "t", notifications=notes, reader=reader), notes


def test_consumer_hands_over_in_order_and_commits_what_was_handed() -> None:
    objects: dict[str, bytes] = {}
    rs = [batch("k0", [(1, 0, recs("a", "b"))], 0, objects), batch("k1", [(1, 1, recs("c"))], 1, objects)]
    c, notes = consumer(rs, objects)
    with c:
        it = c.poll(5)
        assert bytes(next(it).value) == b"a"
        assert c.commit() == {}                       # batch 0 is not fully handed yet
        assert [bytes(r.value) for r in it] == [b"b"]
        assert c.commit() == {0: 1}
        assert values(c, 1) == [b"c"] and c.commit() == {0: 2}
        assert c.position() == {0: 2}
    assert notes.commits == [{0: 1}, {0: 2}] and notes.closed


def test_consumer_drops_retried_duplicates_by_default_and_not_when_off() -> None:
    objects: dict[str, bytes] = {}
    rs = [batch("k0", [(7, 0, recs("a")), (7, 1, recs("b"))], 0, objects),
          batch("k1", [(7, 1, recs("b")), (7, 2, recs("c"))], 1, objects)]   # sequence 1 retried
    c, _ = consumer(rs, objects)
    with c:
        assert values(c, 2) == [b"a", b"b", b"c"]
        assert (c.metrics.duplicate_messages, c.metrics.duplicates_dropped) == (1, 1)
        c.seek(0, 0)                                      # read again on purpose: delivered again
        assert values(c, 2) == [b"a", b"b", b"c"]
    off, _ = consumer(rs, objects, dedup=False)
    with off:
        assert values(off, 2) == [b"a", b"b", b"b", b"c"]
        assert off.metrics.duplicate_messages == 0


def test_consumer_raises_a_corrupt_batch_until_sought_past_or_skips_when_asked() -> None:
    objects: dict[str, bytes] = {}
    rs = [batch(f"k{i}", [(1, i, recs(str(i)))], i, objects) for i in range(3)]
    objects["k1"] = objects["k1"][:-1] + b"\x00"        # same size, other bytes: CRC mismatch
    c, _ = consumer(rs, objects)
    with c:
        assert values(c, 1) == [b"0"]
        for _ in range(2):
            with pytest.raises(DataLossError, match="CRC32C") as e:
                list(c.poll(5))
            assert (e.value.partition, e.value.offset, e.value.location) == (0, 1, "k1")
        c.seek(0, 2)
        assert values(c, 1) == [b"2"]
    del objects["k1"]
    c, _ = consumer(rs, objects, on_data_loss="skip")
    with c:
        assert values(c, 2) == [b"0", b"2"]
        assert c.metrics.data_loss_skipped == 1 and c.commit() == {0: 3}


def test_read_in_order_checks_size_and_skips_by_policy(caplog: pytest.LogCaptureFixture) -> None:
    objects: dict[str, bytes] = {}
    rs = [batch(f"k{i}", [(1, i, recs(str(i)))], i, objects) for i in range(3)]
    objects["k0"] = objects["k0"][:-1]                    # one byte shorter than notified (truncated)
    reader = BatchReader(MemqConfig(), 2, source=lambda: MemorySource(objects))
    ptrs = [BatchPointer("t", ObjectLocation("b", f"k{i}"), rs[i].notification.size) for i in range(3)]

    def build(decoded: object) -> int:
        return len(decoded[1])   # type: ignore[index]

    try:
        with pytest.raises(DataLossError, match="expected"):
            list(read_in_order(reader, [(p, build) for p in ptrs], 2,
                               DataLossPolicy(False, logging.getLogger("r"), "")))
        with caplog.at_level(logging.WARNING, logger="r"):
            assert list(read_in_order(reader, [(p, build) for p in ptrs], 2,
                                      DataLossPolicy(True, logging.getLogger("r"), ""))) == [1, 1]
        assert "k0" in caplog.text
        header, log = reader.read_one(ptrs[2], rs[2].notification.header_size, 0, 5)
        assert (header.sequence, bytes(log.value)) == (2, b"2")
        with pytest.raises(DataLossError, match="counts 1 LogMessages"):
            reader.read_one(ptrs[2], rs[2].notification.header_size, 1, 5)
    finally:
        reader.close()


def test_parts_of_one_object_are_read_by_range_and_a_damaged_part_fails_alone() -> None:
    """A shared object: two batches back to back; each pointer reads (and verifies) its own range."""
    objects: dict[str, bytes] = {}
    first = batch("a", [(1, 0, recs("a0", "a1"))], 0, objects)
    second = batch("b", [(2, 0, recs("b0"))], 1, objects)
    objects["shared"] = objects.pop("a") + objects.pop("b")
    n1, n2 = first.notification, second.notification
    ptrs = [BatchPointer("t", ObjectLocation("b", "shared"), n1.size, n1.crc32c, 0, 0, 0),
            BatchPointer("t", ObjectLocation("b", "shared"), n2.size, n2.crc32c, 0, 1, n1.size)]
    reader = BatchReader(MemqConfig(), 2, source=lambda: MemorySource(objects))

    def build(decoded: object) -> list[bytes]:
        return [bytes(r.value) for _, logs in decoded[1] for r in logs]   # type: ignore[index]

    try:
        assert [reader.submit(p, build).result(5) for p in ptrs] == [[b"a0", b"a1"], [b"b0"]]
        header, log = reader.read_one(ptrs[1], n2.header_size, 0, 5)
        assert (header.producer_id, bytes(log.value)) == (2, b"b0")
        damaged = bytearray(objects["shared"])
        damaged[n1.size + n2.size - 1] ^= 0xFF                  # the last byte of the second part
        objects["shared"] = bytes(damaged)
        assert reader.submit(ptrs[0], build).result(5) == [b"a0", b"a1"]
        with pytest.raises(DataLossError, match=f"bytes {n1.size}..{n1.size + n2.size - 1}.*CRC32C"):
            reader.submit(ptrs[1], build).result(5)
    finally:
        reader.close()


def test_a_reader_decodes_with_the_decoder_it_was_given_and_a_bad_column_is_a_lost_batch() -> None:
    """Spark's reader decodes to columns; a column that fails to convert while the caller builds
    its rows (the decoders convert lazily) loses that batch alone, as a corrupt body would."""
    from memq.errors import CorruptDataError
    from memq.format.columns import decode_batch_columns

    objects: dict[str, bytes] = {}
    rs = [batch(f"k{i}", [(1, i, recs(str(i), "x"))], i, objects) for i in range(2)]
    ptrs = [BatchPointer("t", ObjectLocation("b", f"k{i}"), r.notification.size, r.notification.crc32c)
            for i, r in enumerate(rs)]
    reader = BatchReader(MemqConfig(), 2, source=lambda: MemorySource(objects), decode=decode_batch_columns)

    def build(decoded: Any) -> list[bytes]:
        return [v for _, cols in decoded[1] for v in cols.column("value").to_pylist()]

    def failing(decoded: Any) -> None:
        raise CorruptDataError("field value is not binary")

    try:
        assert [reader.submit(p, build).result(5) for p in ptrs] == [[b"0", b"x"], [b"1", b"x"]]
        with pytest.raises(DataLossError, match="k1.*is corrupt: field value"):
            reader.submit(ptrs[1], failing).result(5)
    finally:
        reader.close()
