"""The read path without servers: parts framed as Kafka batches at their offsets
(memq.kafka_api.records) and the broker's hot-object cache (memq.broker.read_cache)."""

from __future__ import annotations

import asyncio
import random
from itertools import accumulate

import pytest
from tests.support.kafka_read import ListedNotes, part_of, read_placed, recs
from hypothesis import given, settings
from hypothesis import strategies as st

from memq.broker.metrics import BrokerMetrics
from memq.broker.read_cache import ReadCache
from memq.broker.reads import Reads
from memq.config import KafkaConfig
from memq.broker.bases import Bases, MemoryCheckpoints
from memq.broker.consumer_group_audit import GroupAudit
from memq.broker.logs import Logs
from memq.format.metadata import TopicMetadata
from tests.support.clock import FakeClock
from tests.support.consumer_fakes import CountingSource, SinkRecorder, batch
from tests.support.consumer_fakes import recs as recs_of
from memq.format import LogMessage
from memq.format.kafka_records import (KafkaCodec, decode_kafka_records, encode_kafka_batch, split_kafka_batches,
                                       verify_kafka_batch)
from memq.kafka_api.dedup import duplicates, part_messages
from memq.kafka_api.offsets import first_offset, kafka_offset
from memq.kafka_api.records import frame_part, place
from memq.log.model import SPARSE

records = st.lists(st.builds(
    LogMessage, value=st.binary(max_size=40), key=st.none() | st.binary(max_size=8),
    headers=st.lists(st.tuples(st.text(max_size=6), st.binary(max_size=6)), max_size=2).map(tuple),
    timestamp_ms=st.integers(0, 2**41), message_id=st.none()), min_size=1, max_size=15)


@settings(max_examples=80)
@given(recs=records)
def test_encoded_kafka_batches_decode_to_the_same_records(recs: list[LogMessage]) -> None:
    assert decode_kafka_records(encode_kafka_batch(recs)) == recs


def test_a_mixed_part_frames_into_batches_at_each_records_offset() -> None:
    a, b, c, d = recs("a", 3), recs("b", 2), recs("c", 4), recs("d", 1)
    part = frame_part(part_of([("memq", a), ("memq", b), ("kafka", c), ("memq", d)]))
    # a run of memq Messages is one batch; a Kafka producer's batch is served as it came
    assert [(x.first_index, x.count) for x in part.batches] == [(0, 5), (5, 4), (9, 1)]
    out = bytearray()
    assert place(part, first_offset(7), 0, out, 1 << 20) == 10
    assert read_placed(bytes(out)) == [(kafka_offset(7, i), r) for i, r in enumerate(a + b + c + d)]


def test_long_runs_of_memq_records_are_framed_in_batches_of_bounded_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("memq.kafka_api.records.FRAMED_BATCH_BYTES", 100)
    a, b = recs("a", 30), recs("b", 30)
    part = frame_part(part_of([("memq", a), ("memq", b)]))
    assert len(part.batches) > 4 and all(x.count <= 6 for x in part.batches)
    assert [x.first_index for x in part.batches] == list(accumulate([0] + [x.count for x in part.batches[:-1]]))
    out = bytearray()
    assert place(part, first_offset(3), 0, out, 1 << 20) == 60
    assert read_placed(bytes(out)) == [(kafka_offset(3, i), r) for i, r in enumerate(a + b)]


def test_placing_from_an_index_skips_whole_batches_before_it_and_keeps_within_the_limit() -> None:
    part = frame_part(part_of([("memq", recs("a", 3)), ("kafka", recs("c", 4)), ("memq", recs("d", 2))]))
    sizes = [len(x.data) for x in part.batches]
    out = bytearray()
    assert place(part, first_offset(1), 4, out, sizes[1]) == 7          # the Kafka batch holding index 4; the next does not fit
    assert [o for o, _ in read_placed(bytes(out))] == [kafka_offset(1, i) for i in range(3, 7)]
    small = bytearray()
    assert place(part, first_offset(1), 0, small, 10) == 0              # nothing fits, and nothing is forced
    assert place(part, first_offset(1), 0, small, 10, at_least_one=True) == 3 and len(small) == sizes[0]


def test_a_messages_copies_are_dropped_by_its_id_whatever_the_window_holds() -> None:
    """Deterministic: the same window gives the same drops; only ids seen before are dropped."""
    a, b, c = (1, 0, 0), (1, 0, 1), (2, 0, 0)
    assert duplicates([], [a, b, c]) == frozenset()
    assert duplicates([[a], [c, (9, 9, 9)]], [a, b, c]) == {0, 2}
    assert duplicates([], [a, b, a]) == {2}                       # twice in one part: the first stays
    assert duplicates([[(1, 1, 0)]], [a]) == frozenset()          # another epoch is another Message


def test_dropped_messages_leave_gaps_and_every_other_record_keeps_its_offset() -> None:
    a, b, c, d = recs("a", 3), recs("b", 2), recs("c", 4), recs("d", 2)
    raw = part_of([("memq", a), ("memq", b), ("kafka", c), ("memq", d)])
    assert [(m.id, m.records) for m in part_messages(raw)] == [((1, 0, 0), 3), ((1, 0, 1), 2), ((2, 0, 2), 4),
                                                           ((1, 0, 3), 2)]
    whole = bytearray()
    place(frame_part(raw), first_offset(4), 0, whole, 1 << 20)
    kept = [(o, r) for o, r in read_placed(bytes(whole))]
    for drop in ({1}, {2}, {0, 3}, {3}, {0, 1, 2, 3}):
        part = frame_part(raw, frozenset(drop))
        out = bytearray()
        # the whole part is passed, a dropped end included: a reader is moved past it, never stuck
        assert place(part, first_offset(4), 0, out, 1 << 20) == 11 and part.count == 11
        gone = {i for m in drop for i in range([0, 3, 5, 9][m], [3, 5, 9, 11][m])}
        assert read_placed(bytes(out)) == [(o, r) for i, (o, r) in enumerate(kept) if i not in gone]
    out = bytearray()
    assert place(frame_part(raw, frozenset({3})), first_offset(4), 9, out, 1 << 20) == 11 and out == bytearray()


def test_memq_records_go_out_zstd_compressed_and_decompressed_for_fetches_before_v10() -> None:
    a = [r._replace(value=b"the same sentence, again and again %d" % (i % 10)) for i, r in enumerate(recs("a", 400))]
    part = frame_part(part_of([("memq", a)]))
    [batch] = part.batches
    assert verify_kafka_batch(batch.data).codec is KafkaCodec.ZSTD
    plain = encode_kafka_batch(a)
    assert len(batch.data) * 5 < len(plain)   # what zstd saves on the wire and in the read cache
    new, old = bytearray(), bytearray()
    assert place(part, first_offset(2), 0, new, 1 << 20) == place(part, first_offset(2), 0, old, 1 << 20, zstd=False) == 400
    assert [verify_kafka_batch(b).codec for b in split_kafka_batches(bytes(old))] == [KafkaCodec.NONE]
    assert read_placed(bytes(new)) == read_placed(bytes(old)) == [(kafka_offset(2, i), r) for i, r in enumerate(a)]


def test_records_that_do_not_compress_go_out_as_they_are() -> None:
    a = [r._replace(value=random.randbytes(200)) for r in recs("a", 50)]
    [batch] = frame_part(part_of([("memq", a)])).batches
    assert verify_kafka_batch(batch.data).codec is KafkaCodec.NONE
    assert decode_kafka_records(batch.data) == a


def test_corrupt_parts_raise_format_errors() -> None:
    from memq.errors import FormatError
    raw = bytearray(part_of([("memq", recs("a", 3))]))
    raw[-3] ^= 0xFF
    with pytest.raises(FormatError):
        frame_part(bytes(raw))


# --- the read cache -------------------------------------------------------------------------


def counter(c: object) -> float:
    return c._value.get()  # type: ignore[attr-defined]


async def test_concurrent_misses_of_one_key_load_once_and_others_are_served_meanwhile() -> None:
    m = BrokerMetrics("b1")
    cache = ReadCache(1000, m)
    gate = asyncio.Event()
    loads: list[str] = []

    async def slow() -> tuple[bytes, int]:
        loads.append("slow")
        await gate.wait()
        return b"x" * 10, 10

    async def fast() -> tuple[bytes, int]:
        loads.append("fast")
        return b"y", 1

    readers = [asyncio.ensure_future(cache.get("k", slow)) for _ in range(5)]
    await asyncio.sleep(0)
    assert await asyncio.wait_for(cache.get("other", fast), 1) == b"y"   # a miss never stalls other keys
    readers[0].cancel()            # one reader giving up cancels nothing the others wait for
    gate.set()
    assert [await r for r in readers[1:]] == [b"x" * 10] * 4
    assert loads == ["slow", "fast"] and counter(m.read_cache_misses) == 2
    assert await cache.get("k", slow) == b"x" * 10 and loads == ["slow", "fast"]


async def test_the_cache_stays_within_its_bytes_evicting_the_least_recently_used() -> None:
    m = BrokerMetrics("b1")
    cache = ReadCache(100, m)
    for k in "abc":
        cache.put(k, k, 40)        # c evicts a
    assert cache.nbytes == 80 and cache.peek("a") is None and counter(m.read_cache_evictions) == 1

    async def load() -> tuple[str, int]:
        return "B", 40
    assert await cache.get("b", load) == "b"      # a hit: b is now the most recent
    cache.put("d", "d", 40)                       # evicts c, not b
    assert cache.peek("c") is None and cache.peek("b") == "b" and cache.nbytes == 80
    cache.put("huge", "h", 101)                   # larger than the budget: not kept, nothing evicted
    assert cache.peek("huge") is None and cache.nbytes == 80 and counter(m.read_cache_bytes) == 80


# --- the read path's dedup window (memq.broker.reads.Reads) ---------------------------------




async def test_every_starting_point_drops_the_same_copies_and_a_gone_part_stops_nothing() -> None:
    objects: dict[str, bytes] = {}
    a, b, c = recs_of("a", "a2"), recs_of("b", "b2", "b3"), recs_of("c")
    notes = [batch("k0", [(7, 0, a), (7, 1, b)], 0, objects),
             batch("k1", [(8, 0, c), (7, 1, b)], 1, objects),      # a retry of (7, 0, 1), stored again
             batch("k2", [(7, 1, b)], 2, objects),                 # and again
             batch("k3", [(8, 1, c)], 3, objects)]

    def reads(source: CountingSource) -> Reads:
        metrics = BrokerMetrics("b1")
        return Reads(KafkaConfig(), source, ReadCache(1 << 24, metrics), metrics,  # type: ignore[arg-type]
                     broker_id="b1", consumers=lambda _topic: ListedNotes(notes))  # type: ignore[arg-type,return-value]

    async def kept(r: Reads, start: int) -> list[list[int]]:
        """Per part from `start` on, the indexes of the records a reader gets."""
        out = []
        for n in notes[start:]:
            part = await r.readable("n", 0, n)
            out.append([x.first_index + i for x in part.batches for i in range(x.count)])
        return out

    whole = CountingSource(objects)
    assert await kept(reads(whole), 0) == [[0, 1, 2, 3, 4], [0], [], [0]]
    assert whole.gets == 4                           # a part's ids and its batches: one GET
    cold = CountingSource(objects)
    assert await kept(reads(cold), 2) == [[], [0]]   # started at k2: its window still holds k0 and k1
    assert cold.gets == 4
    del objects["k0"]                                # retention took the first object: the rest is read
    assert await kept(reads(CountingSource(objects)), 1) == [[0, 1, 2, 3], [], [0]]


async def test_the_end_a_reader_reaches_is_before_the_copies_a_partition_ends_with() -> None:
    objects: dict[str, bytes] = {}
    notes = [batch("k0", [(7, 0, recs_of("a")), (7, 1, recs_of("b", "b2"))], 0, objects),
             batch("k1", [(8, 0, recs_of("c")), (7, 1, recs_of("b", "b2"))], 1, objects),   # ends in a copy
             batch("k2", [(7, 1, recs_of("b", "b2"))], 2, objects)]                         # a copy alone
    metrics = BrokerMetrics("b1")
    reads = Reads(KafkaConfig(), CountingSource(objects), ReadCache(1 << 24, metrics), metrics,  # type: ignore[arg-type]
                  broker_id="b1", consumers=lambda _topic: ListedNotes(notes))  # type: ignore[arg-type,return-value]
    assert SPARSE.end_of(*await reads.end("n", 0, notes[0])) == kafka_offset(0, 3)
    assert SPARSE.end_of(*await reads.end("n", 0, notes[1])) == kafka_offset(1, 1)   # after c: the copy of b is past it
    assert SPARSE.end_of(*await reads.end("n", 0, notes[2])) == kafka_offset(1, 1)   # k2 gives a reader nothing


async def test_a_groups_commits_report_each_message_it_got_once_when_its_last_record_is_committed() -> None:
    objects: dict[str, bytes] = {}
    notes = [batch("k0", [(7, 0, recs_of("a", "b")), (7, 1, recs_of("c", "d", "e"))], 0, objects),
             batch("k1", [(7, 1, recs_of("c", "d", "e")), (8, 0, recs_of("f"))], 1, objects)]   # (7, 0, 1) again
    metrics = BrokerMetrics("b1")
    reads = Reads(KafkaConfig(), CountingSource(objects), ReadCache(1 << 24, metrics), metrics,  # type: ignore[arg-type]
                  broker_id="b1", consumers=lambda _topic: ListedNotes(notes))  # type: ignore[arg-type,return-value]
    sink = SinkRecorder()
    audit = GroupAudit(reads, Logs(reads, Bases(reads, MemoryCheckpoints())), sink, FakeClock(wall_s=1_000.0))

    async def commit(before: int, after: int) -> list[tuple[int, int]]:
        sink.calls.clear()
        await audit.committed("g", TopicMetadata("t", "n", 1), 0, before, after)
        return [(c.producer_id, c.sequence) for c in sink.calls]

    assert await commit(-1, kafka_offset(0, 4)) == [(7, 0)]               # (7, 0, 1) ends at record 4: not yet
    assert await commit(kafka_offset(0, 4), kafka_offset(1, 0)) == [(7, 1)]
    assert await commit(kafka_offset(1, 0), kafka_offset(1, 4)) == [(8, 0)]   # the copy in k1 is no delivery
    assert await commit(kafka_offset(1, 4), kafka_offset(1, 4)) == []
    assert await commit(-1, kafka_offset(1, 4)) == [(7, 0), (7, 1), (8, 0)]
    assert {(c.group, c.topic, c.count, c.consumed_ms) for c in sink.calls} >= {("g", "t", 2, 1_000_000)}
