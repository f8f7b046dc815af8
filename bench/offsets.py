"""Dense offsets (`memq.kafka_api.dense`): the cost of an offset lookup and of a cold broker's catch-up.

Lookup: one partition of `notes` notifications (record counts drawn 1-2000, as parts of small
and large batches), 200k random records mapped offset -> (notification, index) (a Fetch, a
commit) and back (a part framed at its offsets); the limit is the sparse scheme, a pure shift
(`vs_sparse_to_part`, `vs_sparse_to_offset`: sparse ns over dense ns).

Catch-up: a broker (or consumer, or Spark driver) starting cold counts the notifications after
the newest checkpoint. `parts` real notifications are written to one partition of tansu; the
limit is a bare confluent-kafka Consumer reading them (the read no catch-up can avoid); memq's
catch-up is the same read, each value decoded (`Notification.from_bytes`, as a tail does) and
counted into `PartitionBases` (`catchup_vs_read`: read s over catch-up s). Figures in seconds
per million parts.

Reader lookup: memq's Consumer and the Spark driver ask a broker (`GET /v1/offsets`) for one
checkpoint per partition they start or move on, then count the notifications they read. A broker
(in this process, its own loop thread) serves a dense topic of `LOOKUP_PARTS` parts; `rounds`
lookups by notification and by record offset, ms each. The alternative a reader could take alone
is the broker's cold path: read the checkpoints from ZooKeeper and count, on average, half of
`CHECKPOINT_EVERY` notifications from Kafka (this run's catch-up and ZooKeeper figures);
`lookup_vs_self_count` is that ms over the lookup's.

Checkpoint store: `rounds` writes then reads of one partition's checkpoints (`CHECKPOINTS_KEPT`
entries, `encode_checkpoints`) to ZooKeeper (kazoo set/get) and to S3 (moto: PUT/GET), ms per
call; the ratio `zk_vs_s3` is S3's write+read ms over ZooKeeper's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import threading
import time
import uuid

import boto3
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

from memq.broker.server import Broker
from memq.client.dense_offsets import BrokerOffsets
from memq.client.producer import Producer as MemqProducer
from memq.config import BrokerConfig, TopicConfig
from memq.devcluster import DevCluster
from memq.format.notification import NOTIFICATION_VERSION, Notification
from memq.kafka_api.dense import CHECKPOINT_EVERY, CHECKPOINTS_KEPT, Checkpoint, DenseScheme, PartitionBases, encode_checkpoints
from memq.log.model import SPARSE

LOOKUPS = 200_000
LOOKUP_PARTS = 200


def _scheme(notes: int, seed: int = 5) -> tuple[DenseScheme, list[int]]:
    rnd = random.Random(seed)
    counts = [rnd.randint(1, 2000) for _ in range(notes)]
    bases = PartitionBases(Checkpoint(0, 0))
    bases.add(enumerate(counts))
    return DenseScheme(bases), counts


def _ns(fn, args: list) -> float:
    t0 = time.perf_counter_ns()
    for a in args:
        fn(*a)
    return (time.perf_counter_ns() - t0) / len(args)


def lookups(notes: int) -> dict:
    dense, counts = _scheme(notes)
    rnd = random.Random(9)
    places = [(n, rnd.randrange(counts[n])) for n in (rnd.randrange(notes) for _ in range(LOOKUPS))]
    dense_offsets = [(dense.offset_of(n, i),) for n, i in places]
    sparse_offsets = [(SPARSE.offset_of(n, i),) for n, i in places]
    assert [dense.position_of(*o) for o in dense_offsets[:1000]] == places[:1000]
    fig = {"notes": notes,
           "dense_to_part_ns": min(_ns(dense.position_of, dense_offsets) for _ in range(3)),
           "sparse_to_part_ns": min(_ns(SPARSE.position_of, sparse_offsets) for _ in range(3)),
           "dense_to_offset_ns": min(_ns(dense.offset_of, places) for _ in range(3)),
           "sparse_to_offset_ns": min(_ns(SPARSE.offset_of, places) for _ in range(3))}
    print(f"lookup over {notes} notifications: {fig}", flush=True)
    return fig


def _note(i: int, count: int) -> bytes:
    return Notification(v=NOTIFICATION_VERSION, topic="bench", bucket="memq", key=f"ab/c/topics/bench/{uuid.uuid4().hex}",
                        size=8 << 20, header_size=4096, message_count=10, logmessage_count=count,
                        min_timestamp_ms=1_700_000_000_000 + i, max_timestamp_ms=1_700_000_000_250 + i,
                        crc32c=0x1234567, broker_id="b-1", attempt=1, created_ms=1_700_000_000_300 + i,
                        offset=0).to_bytes()


def _read(bootstrap: str, topic: str, n: int, count_them: bool) -> float:
    """Seconds to read the `n` notifications from the beginning (and, `count_them`, to decode and count them)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-unused", "enable.auto.commit": False})
    bases = PartitionBases(Checkpoint(0, 0))
    try:
        t0 = time.perf_counter()
        c.assign([TopicPartition(topic, 0, 0)])
        got = 0
        while got < n:
            if time.perf_counter() - t0 > 300:
                raise RuntimeError(f"read {got} of {n} notifications within 300 s")
            msgs = [m for m in c.consume(10_000, 0.5) if m.error() is None or m.error().code() != KafkaError._PARTITION_EOF]
            if not msgs:
                continue
            if count_them:
                bases.add((m.offset(), Notification.from_bytes(m.value()).logmessage_count) for m in msgs)
            got += len(msgs)
        took = time.perf_counter() - t0
    finally:
        c.close()
    assert not count_them or bases.next == n
    return took


def catch_up(dc: DevCluster, parts: int) -> dict:
    bootstrap = dc.kafka_bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("bench-notes", 1, 1)])["bench-notes"].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000})
    values = [_note(i, 1000) for i in range(min(parts, 10_000))]
    for i in range(parts):
        while True:
            try:
                p.produce("bench-notes", values[i % len(values)], partition=0)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(60)
    read = [_read(bootstrap, "bench-notes", parts, False) for _ in range(2)]
    counted = [_read(bootstrap, "bench-notes", parts, True) for _ in range(2)]
    fig = {"parts": parts, "read_s_per_million": min(read) * 1e6 / parts,
           "catchup_s_per_million": min(counted) * 1e6 / parts}
    print(f"catch-up: {fig}", flush=True)
    return fig


def reader_lookup(dc: DevCluster, rounds: int) -> dict:
    config = dataclasses.replace(dc.config(cluster="benchoffsets"), broker=BrokerConfig(kafka_port=0))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    broker = Broker(config)
    topic = TopicConfig(name="bench-dense", read_partitions=1, batch_ms=5, offsets="dense")

    async def start_and_write() -> None:
        await broker.start()
        await broker.add_topic(topic)
        async with MemqProducer(dataclasses.replace(config.producer, brokers=broker.url, linger_ms=1)) as p:
            for i in range(LOOKUP_PARTS):   # one Message acked at a time: about a part each
                await (await p.send_many(topic.name, [b"r%d-%d" % (i, j) for j in range(1 + i % 7)]))

    try:
        asyncio.run_coroutine_threadsafe(start_and_write(), loop).result(120)
        brokers = BrokerOffsets((broker.url,))
        end = brokers.checkpoint(topic.name, 0, offset=1 << 40)   # past the end: the next notification
        rnd = random.Random(3)
        t0 = time.perf_counter()
        for i in range(rounds):
            if i % 2:
                brokers.checkpoint(topic.name, 0, note=rnd.randrange(end.note + 1))
            else:
                brokers.checkpoint(topic.name, 0, offset=rnd.randrange(end.base + 1))
        lookup_ms = (time.perf_counter() - t0) * 1e3 / rounds
    finally:
        asyncio.run_coroutine_threadsafe(broker.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    fig = {"lookup_parts": end.note, "lookup_records": end.base, "lookup_ms": lookup_ms}
    print(f"reader lookup: {fig}", flush=True)
    return fig


def checkpoint_store(dc: DevCluster, rounds: int) -> dict:
    blob = encode_checkpoints([Checkpoint(i * 4096, i * 4096 * 1000) for i in range(CHECKPOINTS_KEPT)])
    zk = KazooClient(hosts=dc.zk_hosts)
    zk.start(timeout=30)
    s3 = boto3.client("s3", endpoint_url=dc.s3_endpoint, aws_access_key_id="x", aws_secret_access_key="x",
                      region_name="us-east-1")
    try:
        zk.ensure_path("/bench/offset_bases/t/0")
        t0 = time.perf_counter()
        for _ in range(rounds):
            zk.set("/bench/offset_bases/t/0", blob)
            zk.get("/bench/offset_bases/t/0")
        zk_ms = (time.perf_counter() - t0) * 1e3 / rounds
        t0 = time.perf_counter()
        for _ in range(rounds):
            s3.put_object(Bucket=dc.bucket, Key="offset_bases/t/0", Body=blob)
            s3.get_object(Bucket=dc.bucket, Key="offset_bases/t/0")["Body"].read()
        s3_ms = (time.perf_counter() - t0) * 1e3 / rounds
    finally:
        zk.stop()
        zk.close()
    fig = {"checkpoint_bytes": len(blob), "zk_write_read_ms": zk_ms, "s3_write_read_ms": s3_ms}
    print(f"checkpoint store: {fig}", flush=True)
    return fig


def run(quick: bool) -> dict:
    look = lookups(100_000 if quick else 1_000_000)
    with DevCluster() as dc:
        catch = catch_up(dc, 100_000 if quick else 1_000_000)
        store = checkpoint_store(dc, 50 if quick else 300)
        lookup = reader_lookup(dc, 200 if quick else 2000)
    # a reader alone: one ZooKeeper read (about half a write+read) and half a checkpoint interval counted
    self_count_ms = store["zk_write_read_ms"] / 2 + catch["catchup_s_per_million"] * CHECKPOINT_EVERY / 2 / 1e3
    return {"ratios": {"lookup_vs_self_count": self_count_ms / lookup["lookup_ms"],"vs_sparse_to_part": look["sparse_to_part_ns"] / look["dense_to_part_ns"],
                       "vs_sparse_to_offset": look["sparse_to_offset_ns"] / look["dense_to_offset_ns"],
                       "catchup_vs_read": catch["read_s_per_million"] / catch["catchup_s_per_million"],
                       "zk_vs_s3": store["s3_write_read_ms"] / store["zk_write_read_ms"]},
            "self_count_ms": self_count_ms, **look, **catch, **store, **lookup}
