"""The Spark source's de-duplication without Spark or servers: rows of a duplicate Message
are masked out with `index` kept, Message id columns, and tasks planned in creation order."""

from __future__ import annotations

from memq.format import Compressors, LogMessage, MessageHeader, encode_message
from memq.format.columns import Columns, decode_message_columns
from memq.storage import ObjectLocation
from spark_source.plan import BatchRef, plan_tasks
from spark_source.schema import MESSAGE_ID_COLUMNS, BatchContext, to_record_batch


def message(pid: int, epoch: int, seq: int, *values: bytes) -> tuple[MessageHeader, Columns]:
    logs = [LogMessage(v, None, (), 1_000 + i) for i, v in enumerate(values)]
    return decode_message_columns(encode_message(logs, producer_id=pid, epoch=epoch, sequence=seq), Compressors())


def test_duplicate_messages_are_masked_and_rows_keep_their_place_and_ids() -> None:
    ctx = BatchContext("t", 0, 7, "b", "k")
    msgs = [message(1, 2, 3, b"a", b"b"), message(1, 2, 4, b"c"), message((1 << 64) - 1, 0, 5, b"d", b"e")]
    rows = to_record_batch(ctx, msgs, keep=[True, False, True]).to_pylist()
    assert [r["value"] for r in rows] == [b"a", b"b", b"d", b"e"]
    assert [r["index"] for r in rows] == [0, 1, 3, 4]                  # place in the object
    assert [tuple(r[c] for c in MESSAGE_ID_COLUMNS) for r in rows] == [
        (1, 2, 3, 0), (1, 2, 3, 1), (-1, 0, 5, 0), (-1, 0, 5, 1)]
    assert to_record_batch(ctx, msgs, keep=[False] * 3).num_rows == 0
    timed = to_record_batch(ctx, msgs, start_ms=1_001, keep=[True, False, True]).to_pylist()
    assert [r["value"] for r in timed] == [b"b", b"e"]                 # both masks apply


def ref(p: int, off: int, created: int) -> BatchRef:
    return BatchRef(p, off, ObjectLocation("b", f"k{p}-{off}"), 10, 0, 10, None, created)


def test_tasks_follow_creation_time_across_partitions_when_de_duplicating() -> None:
    groups = [[ref(0, 0, 100), ref(0, 1, 300)], [ref(1, 0, 200), ref(1, 1, 400)]]
    (one,) = plan_tasks(groups, None, drop_duplicates=True)            # small read: one task, copies meet
    assert [(r.partition, r.offset) for r in one.refs] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    two = plan_tasks(groups, 2, drop_duplicates=True)
    assert [[r.created_ms for r in t.refs] for t in two] == [[100, 200], [300, 400]]
    per_partition = plan_tasks(groups, None, drop_duplicates=False)
    assert [[(r.partition, r.offset) for r in t.refs] for t in per_partition] == [[(0, 0), (0, 1)], [(1, 0), (1, 1)]]


def test_a_part_notified_twice_is_planned_once_when_de_duplicating() -> None:
    """A broker published a notification again after its first delivery was unknown: both landed."""
    once, again = ref(0, 3, 100), ref(2, 9, 100)
    again = BatchRef(again.partition, again.offset, once.location, once.size, 0, 10, None, 100)
    groups = [[ref(0, 1, 50), once], [again]]
    (task,) = plan_tasks(groups, None, drop_duplicates=True)
    assert [r.location.key for r in task.refs] == ["k0-1", "k0-3"]
    assert sum(len(t.refs) for t in plan_tasks(groups, None, drop_duplicates=False)) == 3
