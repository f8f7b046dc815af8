"""Storage groups on one broker: topics sealed together into one object, one part each.

In process (file storage behind a gate, notifications recorded in memory), like
test_broker_processor; the S3/Kafka path is in test_shared_objects.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.support.appending import append
from memq.broker.storage_group import GroupWriters, layout
from memq.broker.metrics import BrokerMetrics
from memq.broker.processor import SMALL_BATCH_BYTES, SMALL_BATCHES, TopicProcessor
from memq.broker.publish import PublishPath
from memq.config import TopicConfig
from memq.errors import ConfigError, NotifyError
from memq.format import Notification, decode_batch, object_crc32c, verify_message
from memq.format.wire import Ack, AckCode, AckLevel
from memq.storage.naming import parse_key
from tests.support.processor import GatedStorage, MemoryPublisher, message


def test_layout_puts_parts_back_to_back() -> None:
    parts = layout([[b"ab", b"cde"], [b"f"], [b"gh", b"i"]])
    assert [(p.offset, p.size, p.header_size) for p in parts] == [(0, 5, 2), (5, 1, 1), (6, 3, 2)]
    assert parts[2].crc32c == object_crc32c([b"ghi"])


class Group:
    """Topics t0..tn-1 on one broker, all in storage group "g" unless `own` names theirs."""

    def __init__(self, tmp_path: Path, n: int, own: dict[str, str] | None = None, republish_s: float = 0.0,
                 **topic: Any) -> None:
        self.storage = GatedStorage(tmp_path)
        self.publisher = MemoryPublisher()
        self.acks: list[Ack] = []
        metrics = BrokerMetrics("b1")
        path = PublishPath(self.publisher, metrics, republish_s=republish_s)
        self.writers = writers = GroupWriters(storage=self.storage, path=path,  # type: ignore[arg-type]
                                              broker_id="b1", metrics=metrics)
        self.procs: dict[str, TopicProcessor] = {}
        for i in range(n):
            name = f"t{i}"
            cfg = TopicConfig(name=name, storage_group=(own or {}).get(name, "g"),
                              **{"batch_ms": 10_000, "batch_bytes": 1 << 20, "max_message_bytes": 1 << 20, **topic})
            self.procs[name] = TopicProcessor(cfg, cluster="test", broker_id="b1", storage=self.storage,  # type: ignore[arg-type]
                                              publisher=self.publisher, metrics=metrics, busy_wait_s=0.2,
                                              group=writers.writer(cfg))

    async def append(self, topic: str, seq: int, *, seal: bool = False, **kw: Any) -> Ack | None:
        data = message(seq, **kw)
        return await append(self.procs[topic], data, seq, AckLevel.ALL, self.acks.append, seal=seal)

    async def wait_acks(self, n: int) -> None:
        async with asyncio.timeout(5):
            while len(self.acks) < n:
                await asyncio.sleep(0.005)

    def notes(self) -> dict[str, Notification]:
        return {n.topic: n for _, n in self.publisher.sent}


async def test_one_seal_stores_every_topics_batch_as_a_part_of_one_object(tmp_path: Path) -> None:
    g = Group(tmp_path, 3)
    await g.append("t0", 1)
    await g.append("t1", 2)
    await g.append("t1", 3)
    await g.append("t2", 4, seal=True)          # t2's flush: the object goes, with t0's and t1's batches
    await g.wait_acks(4)
    assert all(a.ok for a in g.acks) and len(g.storage.puts) == 1
    loc = g.storage.puts[0]
    assert parse_key(loc.key).group == "g" and "/groups/g/" in loc.key
    obj = await g.storage.get(loc)
    notes = g.notes()
    assert sorted(notes) == ["t0", "t1", "t2"] and {n.key for n in notes.values()} == {loc.key}
    assert sum(n.size for n in notes.values()) == len(obj)
    for topic, seqs in (("t0", [1]), ("t1", [2, 3]), ("t2", [4])):
        n = notes[topic]
        part = obj[n.offset:n.offset + n.size]
        assert object_crc32c([part]) == n.crc32c
        header, msgs = decode_batch(part)
        assert [h.sequence for h, _ in msgs] == seqs and header.header_size == n.header_size
    assert {(a.id, a.key) for a in g.acks} == {(s, loc.key) for s in (1, 2, 3, 4)}


async def test_a_flush_to_many_topics_seals_one_object(tmp_path: Path) -> None:
    """A producer's flush marks its last Message to every topic: they go together, not one object each."""
    g = Group(tmp_path, 4)
    for i, topic in enumerate(g.procs):
        await g.append(topic, i, seal=True)
        await asyncio.sleep(0)                  # each on its own turn of the loop, as frames arrive
    await g.wait_acks(4)
    assert len(g.storage.puts) == 1 and sorted(g.notes()) == ["t0", "t1", "t2", "t3"]


async def test_a_topic_with_its_own_group_never_shares(tmp_path: Path) -> None:
    g = Group(tmp_path, 3, own={"t2": "", "t1": "solo"})
    for i, topic in enumerate(("t0", "t1", "t2")):
        await g.append(topic, i)
    await g.procs["t0"].close()                 # seals t0's group ("g") only
    await g.wait_acks(1)
    assert len(g.storage.puts) == 1 and g.notes().keys() == {"t0"}
    await g.append("t2", 9, seal=True)
    await g.append("t1", 8, seal=True)
    await g.wait_acks(4)
    keys = {topic: parse_key(n.key) for topic, n in g.notes().items()}
    assert (keys["t0"].group, keys["t1"].group, keys["t2"].group, keys["t2"].topic) == ("g", "solo", "", "t2")
    assert len({n.key for n in g.notes().values()}) == 3 and all(n.offset == 0 for n in g.notes().values())


async def test_a_failed_put_fails_every_topic_of_the_object(tmp_path: Path) -> None:
    g = Group(tmp_path, 2)
    g.storage.fail = True
    await g.append("t0", 1)
    await g.append("t1", 2, seal=True)
    await g.wait_acks(2)
    assert all(not a.ok and a.code is AckCode.STORAGE for a in g.acks)
    assert "one object with t0, t1" in g.acks[0].error
    assert all(p.busy_slots == 0 for p in g.procs.values())     # slots freed: the ring is not leaked


async def test_a_failed_publish_fails_only_that_topic(tmp_path: Path) -> None:
    g = Group(tmp_path, 2)
    real = g.publisher.publish

    async def publish(kafka_topic: str, n: Notification) -> tuple[int, int]:
        if n.topic == "t0":
            raise RuntimeError("injected: t0's notification topic is gone")
        return await real(kafka_topic, n)

    g.publisher.publish = publish  # type: ignore[method-assign]
    await g.append("t0", 1)
    await g.append("t1", 2, seal=True)
    await g.wait_acks(2)
    by_id = {a.id: a for a in g.acks}
    assert (by_id[1].ok, by_id[1].code, by_id[2].ok) == (False, AckCode.NOTIFY, True)


def test_storage_group_names_are_checked_where_they_are_set() -> None:
    """A group name becomes a key segment: a bad one fails at config time, naming the setting."""
    assert TopicConfig("t").storage_group == "shared" and TopicConfig("t", storage_group="").storage_group == ""
    for bad in ("a/b", "a b", "ü"):
        with pytest.raises(ConfigError, match=f"topic t: storage_group {bad!r}"):
            TopicConfig("t", storage_group=bad)


async def test_small_batches_give_their_slot_back_when_their_object_takes_them(tmp_path: Path) -> None:
    """A trickle topic has a part in most objects of its group, and each may wait seconds for
    its notification: a count of slots meant for full batches filled, and its next Message
    waited. Small batches are bounded by bytes and SMALL_BATCHES instead; full ones keep theirs."""
    g = Group(tmp_path, 2, ring_slots=2)
    g.storage.gate.clear()                                   # every object waits for its PUT
    seal = g.writers.writer(g.procs["t0"].config).seal
    for seq in range(SMALL_BATCHES + 2):                     # a batch, and an object, each
        assert await asyncio.wait_for(g.append("t0", seq), 1.0) is None
        seal()
    big = SMALL_BATCH_BYTES + 1000
    assert await asyncio.wait_for(g.append("t1", 100, n=1, size=big), 1.0) is None
    seal()
    assert (g.procs["t0"].busy_slots, g.procs["t1"].busy_slots) == (2, 1)   # the last two, the big one
    ack = await g.append("t0", 99)                           # 16 small ones out, both slots held
    assert ack is not None and ack.code is AckCode.BUSY
    g.storage.gate.set()
    await g.wait_acks(SMALL_BATCHES + 3)
    assert all(a.ok for a in g.acks) and len(g.storage.puts) == SMALL_BATCHES + 3
    assert all(p.busy_slots == 0 for p in g.procs.values())
    assert await asyncio.wait_for(g.append("t0", 200), 1.0) is None    # slots and byte budget back


async def test_a_failed_notification_is_published_again_and_a_resend_meanwhile_waits_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A publish that timed out may land later: the batch is not failed (its producer would
    resend, and the resend be stored again); the same notification goes again while the
    Messages stay held, so a resend gets the original's outcome and nothing is stored twice."""
    monkeypatch.setattr("memq.broker.publish.REPUBLISH_BACKOFF_S", (0.05, 0.05))
    g = Group(tmp_path, 1, republish_s=5.0)
    real = g.publisher.publish
    failures = 3

    async def publish(kafka_topic: str, n: Notification) -> tuple[int, int]:
        nonlocal failures
        if failures:
            failures -= 1
            raise NotifyError("injected: Local: Message timed out")
        return await real(kafka_topic, n)

    g.publisher.publish = publish  # type: ignore[method-assign]
    await g.append("t0", 1, seal=True)
    async with asyncio.timeout(5):
        while failures > 1:                      # publishing again: the Message is still held
            await asyncio.sleep(0.005)
    assert await append(g.procs["t0"], message(1), 2, AckLevel.ALL, g.acks.append) is None   # a resend: waits
    await g.wait_acks(2)
    assert [(a.id, a.ok) for a in sorted(g.acks, key=lambda a: a.id)] == [(1, True), (2, True)]
    assert g.acks[0].key == g.acks[1].key and len(g.storage.puts) == 1 and len(g.publisher.sent) == 1


async def test_a_notification_failing_past_the_republish_time_fails_its_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("memq.broker.publish.REPUBLISH_BACKOFF_S", (0.05, 0.05))
    g = Group(tmp_path, 1, republish_s=0.3)
    g.publisher.fail = True
    await g.append("t0", 1, seal=True)
    await g.wait_acks(1)
    assert (g.acks[0].ok, g.acks[0].code) == (False, AckCode.NOTIFY)


@pytest.mark.parametrize("storage_group", ["", "g"])
async def test_a_topics_partitions_fill_batches_of_their_own_in_one_object_published_to_their_partition(
        tmp_path: Path, storage_group: str) -> None:
    """A topic of three read partitions, with objects of its own or in a group: a seal stores one
    object with a part per partition written, each published to its partition; the fill's size
    counts every partition's bytes; a Message naming no partition joins a partition the fill has."""
    storage, publisher, metrics = GatedStorage(tmp_path), MemoryPublisher(), BrokerMetrics("b1")
    writers = GroupWriters(storage=storage, path=PublishPath(publisher, metrics),  # type: ignore[arg-type]
                           broker_id="b1", metrics=metrics)
    size = len(message(0))
    cfg = TopicConfig(name="c", read_partitions=3, storage_group=storage_group, batch_ms=10_000,
                      batch_bytes=4 * size, max_message_bytes=size)
    writer = writers.writer(cfg)
    proc = TopicProcessor(cfg, cluster="test", broker_id="b1", storage=storage,  # type: ignore[arg-type]
                          publisher=publisher, metrics=metrics, group=writer)
    acks: list[Ack] = []
    for seq, partition in enumerate((2, 0, -1, 2)):   # the fourth reaches batch_bytes: one seal
        data = message(seq)
        await proc.append(memoryview(data), verify_message(data), seq, AckLevel.ALL, acks.append, partition=partition)
    async with asyncio.timeout(5):
        while len(acks) < 4:
            await asyncio.sleep(0.005)
    assert len(storage.puts) == 1 and writer.members == ["c"]     # one object: a part per partition
    assert sorted((a.id, a.partition, a.index) for a in acks) == [(0, 2, 0), (1, 0, 0), (2, 2, 1), (3, 2, 2)]
    notes = [n for _, n in publisher.sent]
    assert sorted(n.logmessage_count for n in notes) == [3, 9] and len({n.key for n in notes}) == 1
    assert {a.partition: a.offset for a in acks if a.partition == 2}.keys() == {2}
    for seq in (4, 5, 6, 7):   # the next fill: Messages naming none stick to one partition, a part
        data = message(seq)
        await proc.append(memoryview(data), verify_message(data), seq, AckLevel.ALL, acks.append)
    async with asyncio.timeout(5):
        while len(acks) < 8:
            await asyncio.sleep(0.005)
    assert len(storage.puts) == 2 and len({a.partition for a in acks[4:]}) == 1
    await proc.close()
    assert writer.members == []
