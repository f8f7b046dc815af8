"""Share groups on a broker's Kafka listener, on the real dev cluster (moto S3, tansu, ZooKeeper):
confluent-kafka's ShareConsumer reads memq topics as a queue, and a byte-level client checks the
answers to bad frames."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import pytest
from prometheus_client import generate_latest
from confluent_kafka import AcknowledgeType, Consumer, KafkaError, Message, ShareConsumer, TopicPartition
from tests.support.kafka_clients import Running, broker_thread, kafka_produce, rows
from tests.support.share_frames import (ShareClient, cstr, flex_request, heartbeat_body, parse_heartbeat,
                                        parse_share_fetch, share_fetch_body)
from tests.support.waiting import wait_for

from memq.config import BrokerConfig, MemqConfig, ShareConfig, TopicConfig
from memq.client.cluster import fetch_metadata
from memq.devcluster import DevCluster, GovernedCluster
from memq.broker.share.partition import SharePartition
from memq.kafka_api.metadata_flex import topic_id

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LOCK_MS = 30_000       # long enough that a loaded machine's slow consumer keeps its records
SHORT_LOCK_MS = 3000   # for the test of a lock running out
LIMIT = 3


def share_config(devcluster: DevCluster, cluster: str, lock_ms: int = LOCK_MS) -> MemqConfig:
    base = devcluster.config(cluster=cluster)
    return dataclasses.replace(
        base, broker=BrokerConfig(kafka_port=0),
        zookeeper=dataclasses.replace(base.zookeeper, enabled=True),
        share=ShareConfig(record_lock_ms=lock_ms, delivery_count_limit=LIMIT, auto_offset_reset="earliest",
                          heartbeat_interval_ms=500, session_timeout_ms=10_000, flush_ms=20))


@pytest.fixture(scope="module")
def running(devcluster: DevCluster) -> Iterator[Running]:
    with broker_thread(share_config(devcluster, "kafkashare")) as r:
        yield r


def share_consumer(address: str, group: str, topic: str, explicit: bool = False) -> ShareConsumer:
    c = ShareConsumer({"bootstrap.servers": address, "group.id": group,
                       "share.acknowledgement.mode": "explicit" if explicit else "implicit"})
    c.subscribe([topic])
    return c


def poll_until(c: ShareConsumer, done: Callable[[], bool], timeout_s: float = 60,
               each: Callable[[Message], None] = lambda m: None) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out polling the share group"
        for m in c.poll(0.5) or []:
            assert m.error() is None, m.error()
            each(m)


def host(r: Running, topic: str, offsets: Literal["sparse", "dense"] = "sparse") -> str:
    """Host `topic` (one partition) by its name: a dead-letter topic, or a topic on a restarted broker."""
    cfg = TopicConfig(name=topic, read_partitions=1, batch_ms=50, offsets=offsets)
    asyncio.run_coroutine_threadsafe(r.broker.add_topic(cfg), r.loop).result(30)
    return topic


def cstr_array(items: list[str]) -> bytes:
    return bytes([len(items) + 1]) + b"".join(cstr(i) for i in items)


def group() -> str:
    return f"sg-{uuid.uuid4().hex[:8]}"


def test_more_consumers_than_partitions_all_receive_and_each_record_is_accepted_once(running: Running) -> None:
    topic = running.add_topic(partitions=2, offsets="dense")
    g, members, per_round = group(), 4, 200
    got: list[list[tuple[int, int]]] = [[] for _ in range(members)]
    total = Counter[tuple[int, int]]()
    errors: list[BaseException] = []
    lock = threading.Lock()
    stop = threading.Event()

    def member(i: int) -> None:
        try:
            c = share_consumer(running.broker.kafka_address, g, topic)
            try:
                while not stop.is_set():
                    for m in c.poll(0.3) or []:
                        assert m.error() is None, m.error()
                        with lock:
                            got[i].append((m.partition(), m.offset()))
                            total[(m.partition(), m.offset())] += 1
                    time.sleep(0.05)   # work takes time: the others get their share
            finally:
                c.close()
        except BaseException as e:   # noqa: BLE001 - reported by the test thread
            errors.append(e)

    def states() -> list[SharePartition]:
        return [sp for (gg, t, _), sp in list(running.broker.shares.partitions.items()) if gg == g and t == topic]

    threads = [threading.Thread(target=member, args=(i,)) for i in range(members)]
    for t in threads:
        t.start()
    n = 0
    try:
        wait_for(lambda: g in running.broker.shares.groups.groups
                 and len(running.broker.shares.groups.groups[g].members) == members, 60, "every member joined")
        while n < 6 * per_round or (not all(got) and n < 40 * per_round):   # in rounds, as a queue fills
            kafka_produce(running.broker.kafka_address, topic, rows(per_round, f"r{n}"), acks="all")
            n += per_round
            time.sleep(0.2)
        wait_for(lambda: len(total) >= n or errors, 90, f"{n} records received")
        # the members still poll: each poll accepts the records of the one before (implicit mode)
        wait_for(lambda: sum(sp.counters.acknowledged for sp in states()) == n or errors, 60,
                 f"every record accepted ({[(sp.counters, sp.in_flight()) for sp in states()]})")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert errors == []
    assert len(total) == n and max(total.values()) == 1   # nothing delivered twice in a clean run
    assert all(got), [len(x) for x in got]                # every member received records
    assert all(sp.in_flight() == 0 for sp in states())
    text = generate_latest(running.broker.metrics.registry).decode()
    assert f'memq_share_acknowledged_total{{group="{g}"}} {float(n)}' in text
    assert f'memq_share_in_flight_records{{group="{g}"}} 0.0' in text
    assert f'memq_share_redeliveries_total{{group="{g}"}} 0.0' in text


def test_a_killed_consumer_s_records_are_redelivered_after_the_lock_timeout(devcluster: DevCluster) -> None:
    with broker_thread(share_config(devcluster, f"sharelock{uuid.uuid4().hex[:6]}", SHORT_LOCK_MS)) as running:
        killed_consumer_redelivered(running)


def killed_consumer_redelivered(running: Running) -> None:
    topic = running.add_topic(partitions=1)
    g, n = group(), 300
    kafka_produce(running.broker.kafka_address, topic, rows(n, "k"), acks="all")
    script = (
        "import json, sys, time\n"
        "from confluent_kafka import ShareConsumer\n"
        f"c = ShareConsumer({{'bootstrap.servers': {running.broker.kafka_address!r}, 'group.id': {g!r}, "
        "'share.acknowledgement.mode': 'explicit'})\n"
        f"c.subscribe([{topic!r}])\n"
        "held = []\n"
        "while not held:\n"
        "    held = [m.offset() for m in c.poll(0.5) or [] if m.error() is None]\n"
        "print(json.dumps(held), flush=True)\n"
        "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert proc.stdout is not None
        held = json.loads(proc.stdout.readline())
        assert held
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    killed_at = time.monotonic()
    seen: dict[int, int] = {}
    c = share_consumer(running.broker.kafka_address, g, topic)
    first_redelivery: list[float] = []

    def each(m: Message) -> None:
        seen[m.offset()] = m.delivery_count()
        if m.offset() in held and not first_redelivery:
            first_redelivery.append(time.monotonic())

    try:
        poll_until(c, lambda: len(seen) >= n, 90, each)
    finally:
        c.close()
    assert len(seen) == n   # none lost
    assert all(seen[o] == 2 for o in held)   # the killed member's records, delivered a second time
    assert first_redelivery[0] - killed_at >= SHORT_LOCK_MS / 1000 * 0.5   # after the lock ran out, not at once


def test_release_redelivers_reject_and_the_delivery_limit_go_to_the_dead_letter_topic(running: Running) -> None:
    topic = running.add_topic(partitions=1, offsets="dense")
    g = group()
    dlq = host(running, f"{g}-dlq")   # the group's dead-letter topic: <group> + share.dead_letter_suffix
    kafka_produce(running.broker.kafka_address, topic, rows(6, "q"), acks="all")
    c = share_consumer(running.broker.kafka_address, g, topic, explicit=True)
    deliveries = Counter[int]()
    try:
        def each(m: Message) -> None:
            deliveries[m.offset()] += 1
            offsets = sorted(deliveries)
            if m.offset() == offsets[0]:
                c.acknowledge(m, AcknowledgeType.REJECT)          # set aside at once
            elif m.offset() == offsets[1]:
                c.acknowledge(m, AcknowledgeType.RELEASE)         # every time: up to the limit
            else:
                c.acknowledge(m, AcknowledgeType.RELEASE if deliveries[m.offset()] == 1 else AcknowledgeType.ACCEPT)

        def finished() -> bool:
            c.commit_sync()
            return len(deliveries) == 6 and deliveries[sorted(deliveries)[1]] >= LIMIT and all(
                deliveries[o] >= 2 for o in sorted(deliveries)[2:])

        poll_until(c, finished, 90, each)
    finally:
        c.close()
    rejected, limited = sorted(deliveries)[:2]
    assert deliveries[rejected] == 1 and deliveries[limited] == LIMIT
    assert all(deliveries[o] == 2 for o in sorted(deliveries)[2:])   # released once, then accepted
    reader = Consumer({"bootstrap.servers": running.broker.kafka_address, "group.id": "unused",
                       "enable.auto.commit": False})
    dead: list[dict[str, bytes]] = []
    try:
        reader.assign([TopicPartition(dlq, 0, 0)])
        deadline = time.monotonic() + 60
        while len(dead) < 2 and time.monotonic() < deadline:
            for m in reader.consume(10, 0.5):
                if m.error() is None:
                    dead.append(dict(m.headers() or []))
                else:
                    assert m.error().code() == KafkaError._PARTITION_EOF
    finally:
        reader.close()
    by_offset = {int(h["offset"]): h for h in dead}
    assert set(by_offset) == {rejected, limited}
    assert by_offset[rejected]["reason"] == b"rejected" and by_offset[rejected]["delivery_count"] == b"1"
    assert by_offset[limited]["reason"] == b"delivery_limit" and by_offset[limited]["delivery_count"] == b"%d" % LIMIT
    for h in dead:
        assert (h["topic"], h["partition"], h["group"]) == (topic.encode(), b"0", g.encode())


def test_a_broker_restart_keeps_acknowledged_records_acknowledged(devcluster: DevCluster) -> None:
    config = share_config(devcluster, f"sharerestart{uuid.uuid4().hex[:6]}")
    g, n = group(), 400
    with broker_thread(config) as r:
        topic = r.add_topic(partitions=1, offsets="dense")
        kafka_produce(r.broker.kafka_address, topic, rows(n, "x"), acks="all")
        c = share_consumer(r.broker.kafka_address, g, topic, explicit=True)
        accepted: set[int] = set()
        try:
            def each(m: Message) -> None:
                if m.offset() % 2 == 0:
                    c.acknowledge(m, AcknowledgeType.ACCEPT)
                    accepted.add(m.offset())

            def half() -> bool:
                c.commit_sync()
                return len(accepted) >= n // 2

            poll_until(c, half, 60, each)
        finally:
            c.close()   # the unaccepted ones are released as it leaves
    with broker_thread(config) as r:
        host(r, topic, offsets="dense")   # a restarted broker counts the partition's offsets again, alike
        c = share_consumer(r.broker.kafka_address, g, topic)
        again: set[int] = set()
        try:
            poll_until(c, lambda: len(again) >= n - len(accepted), 60, lambda m: again.add(m.offset()))
            extra = c.poll(2.0) or []   # nothing more comes: the accepted ones stay accepted
        finally:
            c.close()
    assert again and not again & accepted and not extra
    assert accepted | again == set(range(n))   # dense: the share-partition's offsets are the record numbers


def test_bad_share_frames_get_errors_and_the_connection_goes_on(running: Running) -> None:
    topic = running.add_topic(partitions=1)
    tid = topic_id(running.config.cluster.name, topic)
    client = ShareClient(running.broker.kafka_address)
    try:
        hb = parse_heartbeat(client.call(76, heartbeat_body("g-bad", "", 0, [topic])))
        assert hb.error == 0 and hb.member_id and hb.assignment == {tid: [0]}
        member = hb.member_id
        described = client.call(77, cstr_array(["g-bad", "g-none"]) + b"\0\0")
        assert b"g-bad" in described and b"Stable" in described and member.encode() in described
        # no session yet: SHARE_SESSION_NOT_FOUND
        got = parse_share_fetch(client.call(78, share_fetch_body("g-bad", member, 5, {(tid, 0): []})))
        assert got.error == 122
        # an impossible acknowledgement batch: INVALID_REQUEST in ShareFetch's shape
        got = parse_share_fetch(client.call(78, share_fetch_body("g-bad", member, 0, {(tid, 0): [(9, 3, 1)]})))
        assert got.error == 42 and got.message
        # a truncated body: INVALID_REQUEST too
        got = parse_share_fetch(client.call(78, share_fetch_body("g-bad", member, 0, {(tid, 0): []})[:-7]))
        assert got.error == 42
        # an unknown topic id: per partition
        ghost = uuid.uuid4()
        got = parse_share_fetch(client.call(78, share_fetch_body("g-bad", member, 0, {(ghost, 0): []}, max_wait_ms=0)))
        assert got.error == 0 and got.parts[(ghost, 0)].error == 100
        # a wrong session epoch
        got = parse_share_fetch(client.call(78, share_fetch_body("g-bad", member, 7, {(tid, 0): []})))
        assert got.error == 123
        # the connection still serves: a good fetch (nothing there yet) answers
        got = parse_share_fetch(client.call(78, share_fetch_body("g-bad", member, 1, {(tid, 0): []}, max_wait_ms=0)))
        assert got.error == 0 and got.parts[(tid, 0)].error == 0
        # a version not served closes the connection, as for every Kafka API
        client.send_raw(flex_request(78, 0, 99, share_fetch_body("g-bad", member, 2, {})))
        with pytest.raises(ConnectionError):
            client.read()
    finally:
        client.close()


def test_two_brokers_each_lead_share_partitions_and_one_coordinates(devcluster: DevCluster, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Governed brokers agree on who coordinates a group and who keeps each share-partition: a
    ShareFetch at the wrong broker is told the leader, and the group reads every record once."""
    monkeypatch.setenv("MEMQ_SHARE_AUTO_OFFSET_RESET", "earliest")   # the broker processes read it
    with GovernedCluster(tmp_path, brokers=2, servers=devcluster, cluster=f"share2{uuid.uuid4().hex[:6]}",
                         broker=BrokerConfig(kafka_port=0)) as gc:
        topic = "queue"
        gc.create_topic(TopicConfig(topic, read_partitions=4, batch_ms=50), brokers=2)
        addresses = [b.kafka_address for b in fetch_metadata(gc.broker("b1").url, 10.0).brokers]
        assert len(addresses) == 2
        n = 800
        kafka_produce(addresses[0], topic, rows(n, "two"), acks="all")
        tid = topic_id(gc.cluster, topic)
        for address in addresses:   # every partition is served by one broker, named to the others
            client = ShareClient(address)
            try:
                hb = parse_heartbeat(client.call(76, heartbeat_body("probe", "", 0, [topic])))
                got = parse_share_fetch(client.call(78, share_fetch_body(
                    "probe", f"m-{address}", 0, {(tid, p): [] for p in range(4)}, max_wait_ms=0, max_records=1)))
                errors = sorted(got.parts[(tid, p)].error for p in range(4))
                assert errors == [0, 0, 6, 6], errors
                assert len(got.endpoints) == 1 and f"{got.endpoints[0][1]}:{got.endpoints[0][2]}" != address
                assert hb.error in (0, 16)   # one of the two coordinates the group, the other says NOT_COORDINATOR
            finally:
                client.close()
        seen = Counter[tuple[int, int]]()
        c = share_consumer(addresses[1], group(), topic)   # it follows each partition to its leader
        try:
            def each(m: Message) -> None:
                seen[(m.partition(), m.offset())] += 1
            poll_until(c, lambda: len(seen) >= n, 90, each)
            c.commit_sync()
        finally:
            c.close()
        assert len(seen) == n and max(seen.values()) == 1


def test_a_sigkilled_broker_loses_no_answered_acknowledgement(devcluster: DevCluster, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """An acknowledgement is answered after its state write: a crash right after loses none,
    and what was acquired but not acknowledged is delivered again."""
    monkeypatch.setenv("MEMQ_SHARE_AUTO_OFFSET_RESET", "earliest")
    with GovernedCluster(tmp_path, brokers=1, servers=devcluster, cluster=f"sharekill{uuid.uuid4().hex[:6]}",
                         broker=BrokerConfig(kafka_port=0)) as gc:
        topic, g, n = "crashq", group(), 400
        gc.create_topic(TopicConfig(topic, read_partitions=1, batch_ms=50))

        def address() -> str:
            return fetch_metadata(gc.broker("b1").url, 10.0).brokers[0].kafka_address

        kafka_produce(address(), topic, rows(n, "c"), acks="all")
        c = share_consumer(address(), g, topic, explicit=True)
        accepted: set[int] = set()
        try:
            def each(m: Message) -> None:
                if m.offset() % 3:
                    c.acknowledge(m, AcknowledgeType.ACCEPT)
                    accepted.add(m.offset())

            def enough() -> bool:
                c.commit_sync()   # returns once the broker answered: the acknowledgements are written
                return len(accepted) >= n // 2

            poll_until(c, enough, 60, each)
            gc.kill_broker("b1")   # SIGKILL, nothing flushed on the way out
            gc.restart_broker("b1")
        finally:
            c.close()   # after the restart: a close towards a dead broker waits out its timeouts
        c = share_consumer(address(), g, topic)
        again: set[int] = set()
        try:
            poll_until(c, lambda: len(again) >= n - len(accepted), 90, lambda m: again.add(m.offset()))
            c.commit_sync()
        finally:
            c.close()
    assert not again & accepted and len(again | accepted) == n
