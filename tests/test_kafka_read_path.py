"""The read path without servers: parts framed as Kafka batches at their offsets
(memq.kafka_api.records) and the broker's hot-object cache (memq.broker.read_cache)."""

from __future__ import annotations

import asyncio
import random
from itertools import accumulate

import pytest
from tests.support.kafka_read import part_of, read_placed, recs
from hypothesis import given, settings
from hypothesis import strategies as st

from memq.broker.metrics import BrokerMetrics
from memq.broker.read_cache import ReadCache
from memq.format import LogMessage
from memq.format.kafka_records import (KafkaCodec, decode_kafka_records, encode_kafka_batch, split_kafka_batches,
                                       verify_kafka_batch)
from memq.kafka_api.offsets import kafka_offset
from memq.kafka_api.records import frame_part, place

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
    assert place(part, 7, 0, out, 1 << 20) == 10
    assert read_placed(bytes(out)) == [(kafka_offset(7, i), r) for i, r in enumerate(a + b + c + d)]


def test_long_runs_of_memq_records_are_framed_in_batches_of_bounded_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("memq.kafka_api.records.FRAMED_BATCH_BYTES", 100)
    a, b = recs("a", 30), recs("b", 30)
    part = frame_part(part_of([("memq", a), ("memq", b)]))
    assert len(part.batches) > 4 and all(x.count <= 6 for x in part.batches)
    assert [x.first_index for x in part.batches] == list(accumulate([0] + [x.count for x in part.batches[:-1]]))
    out = bytearray()
    assert place(part, 3, 0, out, 1 << 20) == 60
    assert read_placed(bytes(out)) == [(kafka_offset(3, i), r) for i, r in enumerate(a + b)]


def test_placing_from_an_index_skips_whole_batches_before_it_and_keeps_within_the_limit() -> None:
    part = frame_part(part_of([("memq", recs("a", 3)), ("kafka", recs("c", 4)), ("memq", recs("d", 2))]))
    sizes = [len(x.data) for x in part.batches]
    out = bytearray()
    assert place(part, 1, 4, out, sizes[1]) == 7          # the Kafka batch holding index 4; the next does not fit
    assert [o for o, _ in read_placed(bytes(out))] == [kafka_offset(1, i) for i in range(3, 7)]
    small = bytearray()
    assert place(part, 1, 0, small, 10) == 0              # nothing fits, and nothing is forced
    assert place(part, 1, 0, small, 10, at_least_one=True) == 3 and len(small) == sizes[0]


def test_memq_records_go_out_zstd_compressed_and_decompressed_for_fetches_before_v10() -> None:
    a = [r._replace(value=b"the same sentence, again and again %d" % (i % 10)) for i, r in enumerate(recs("a", 400))]
    part = frame_part(part_of([("memq", a)]))
    [batch] = part.batches
    assert verify_kafka_batch(batch.data).codec is KafkaCodec.ZSTD
    plain = encode_kafka_batch(a)
    assert len(batch.data) * 5 < len(plain)   # what zstd saves on the wire and in the read cache
    new, old = bytearray(), bytearray()
    assert place(part, 2, 0, new, 1 << 20) == place(part, 2, 0, old, 1 << 20, zstd=False) == 400
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
