"""Kafka clients' groups through memq's listener on the real dev cluster (moto S3, tansu), with
confluent-kafka: Kafka's admin tools delete them (DeleteGroups), with security on the ACLs
decide, over SASL/PLAIN, who may read a topic and who may use, see or delete a group, the audit
counts what a group committed, offsets committed through the relay memq used before are
taken over, a classic group becomes a consumer group as its members upgrade, live, and a
consumer-protocol member subscribes by regular expression."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka import ConsumerGroupTopicPartitions, ConsumerGroupType
from confluent_kafka.admin import AdminClient
from kafka.protocol.consumer.group import OffsetFetchRequest, OffsetFetchResponse
from bench._group_member import member_log
from tests.support.audit import audit_config
from tests.support.cli import memq
from tests.support.cluster import running_broker, topic_config
from tests.support.kafka_clients import broker_thread, kafka_produce, rows
from tests.support.kafka_frames import Wire
from tests.support.waiting import async_wait_for
from tests.support.security import ALICE, ALICE_ENTRY, BOB, BOB_ENTRY

from memq.audit.books import GroupSummary
from memq.audit.dashboard import AuditService
from memq.config import BrokerConfig, SecurityConfig
from memq.devcluster import DevCluster
from memq.kafka_api.groups import mapped_group
from memq.kafka_api.protocol import ErrorCode
from memq.security.tokens import new_token

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CAROL, CAROL_ENTRY = new_token("carol")


def plain(user: str, password: str) -> dict[str, str]:
    """confluent-kafka settings for SASL/PLAIN (a memq token as the password) without TLS."""
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": user,
            "sasl.password": password}


def group_read(address: str, topic: str, group: str, n: int, timeout_s: float = 60, **conf: Any) -> list[bytes]:
    """A group member reads `n` records, commits them and leaves; KafkaException on a consumer error."""
    c = Consumer({"bootstrap.servers": address, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "session.timeout.ms": 6_000, "fetch.wait.max.ms": 200, **conf})
    got: list[bytes] = []
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + timeout_s
        while len(got) < n:
            assert time.monotonic() < deadline, f"read {len(got)} of {n}"
            for m in c.consume(min(500, n - len(got)), 0.5):
                if m.error() is not None:
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(m.error())
                    continue
                got.append(m.value())
        c.commit(asynchronous=False)
    finally:
        c.close()
    return got


def groups_listed(address: str, **conf: Any) -> set[str]:
    admin = AdminClient({"bootstrap.servers": address, **conf})
    return {g.group_id for g in admin.list_consumer_groups(request_timeout=20).result(30).valid}


def delete_group(address: str, group: str, **conf: Any) -> KafkaError | None:
    admin = AdminClient({"bootstrap.servers": address, **conf})
    try:
        admin.delete_consumer_groups([group], request_timeout=20)[group].result(30)
    except KafkaException as e:
        return e.args[0]
    return None


def committed(address: str, topic: str, group: str, **conf: Any) -> int:
    c = Consumer({"bootstrap.servers": address, "group.id": group, **conf})
    try:
        [tp] = c.committed([TopicPartition(topic, 0)], timeout=20)
        return tp.offset
    finally:
        c.close()


async def test_admin_tools_delete_a_group_and_its_committed_offsets(
        devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("kdel")
    config = dataclasses.replace(devcluster.config(topics=[topic_config(topic, read_partitions=1, batch_ms=50)]),
                                 broker=BrokerConfig(kafka_port=0))
    group = f"g-{uuid.uuid4().hex[:6]}"
    async with running_broker(config) as broker:
        address = broker.kafka_address
        await asyncio.to_thread(kafka_produce, address, topic, rows(20, "del"), acks="all")
        assert len(await asyncio.to_thread(group_read, address, topic, group, 20)) == 20
        assert await asyncio.to_thread(committed, address, topic, group) > 0
        assert group in await asyncio.to_thread(groups_listed, address)
        assert await asyncio.to_thread(delete_group, address, group) is None
        assert group not in await asyncio.to_thread(groups_listed, address)
        assert await asyncio.to_thread(committed, address, topic, group) < 0   # its offsets went with it


async def test_a_group_1000_records_behind_lags_1000_in_kafkas_admin_tools(
        devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    """On a dense topic an offset is a record number: lag (high watermark minus committed) counts
    the records a group has not read, as AdminClient and a consumer's watermarks show it."""
    topic = unique_name("klag")
    config = dataclasses.replace(devcluster.config(topics=[topic_config(topic, read_partitions=1, batch_ms=50,
                                                                        offsets="dense")]),
                                 broker=BrokerConfig(kafka_port=0))
    group = f"lag-{uuid.uuid4().hex[:6]}"
    async with running_broker(config) as broker:
        address = broker.kafka_address
        for i in range(3):   # parts of 400 records each
            await asyncio.to_thread(kafka_produce, address, topic, rows(400, f"lag{i}"), acks="all")
        assert len(await asyncio.to_thread(group_read, address, topic, group, 200)) == 200

        def lag() -> tuple[int, int]:
            admin = AdminClient({"bootstrap.servers": address})
            asked = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])
            [tp] = admin.list_consumer_group_offsets([asked])[group].result(30).topic_partitions
            c = Consumer({"bootstrap.servers": address, "group.id": group})
            try:
                return tp.offset, c.get_watermark_offsets(TopicPartition(topic, 0), timeout=20)[1]
            finally:
                c.close()
        done, high = await asyncio.to_thread(lag)
        assert (done, high, high - done) == (200, 1200, 1000)
        shown = await asyncio.to_thread(memq, "status", env={"MEMQ_PRODUCER_BROKERS": broker.url, "COLUMNS": "250",
                                                             "MEMQ_KAFKA_BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers})
        cells = [[c.strip() for c in line.split("│")[1:-1]] for line in shown.stdout.decode().splitlines()]
        assert [group, topic, "1", "1000"] in cells, (shown.stdout + shown.stderr).decode()


async def test_acls_decide_who_reads_a_topic_and_uses_sees_or_deletes_a_group(
        devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("kgacl")
    ok, other, hidden = (f"{g}-{uuid.uuid4().hex[:6]}" for g in ("ok", "other", "hidden"))
    config = dataclasses.replace(
        devcluster.config(topics=[topic_config(topic, read_partitions=1, batch_ms=50)]),
        broker=BrokerConfig(kafka_port=0),
        security=SecurityConfig(enabled=True, tokens=(str(ALICE_ENTRY), str(BOB_ENTRY), str(CAROL_ENTRY)),
                                acls=(f"allow alice produce literal:{topic}", f"allow alice consume literal:{topic}",
                                      f"allow alice consume group:{ok}", f"allow alice describe group:{other}",
                                      f"allow bob describe literal:{topic}",
                                      f"allow bob consume group:{ok}", f"allow carol admin group:{ok}")))
    async with running_broker(config) as broker:
        address = broker.kafka_address
        alice, bob, carol = plain("alice", ALICE), plain("bob", BOB), plain("carol", CAROL)
        await asyncio.to_thread(kafka_produce, address, topic, rows(30, "acl"), acks="all", **alice)
        assert len(await asyncio.to_thread(group_read, address, topic, ok, 30, **alice)) == 30
        # groups alice may not use: one she may describe (JoinGroup refused), one she may not
        # even find (FindCoordinator refused)
        for group in (other, hidden):
            with pytest.raises(KafkaException) as refused:
                await asyncio.to_thread(group_read, address, topic, group, 1, 30, **alice)
            assert refused.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
        # bob may use the group but not read the topic: Fetch refuses him
        c = Consumer({"bootstrap.servers": address, "group.id": ok, "enable.auto.commit": False, **bob})
        try:
            c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            errors: list[int] = []
            deadline = time.monotonic() + 30
            while not errors and time.monotonic() < deadline:
                errors = [m.error().code() for m in await asyncio.to_thread(c.consume, 10, 0.5)
                          if m.error() is not None and m.error().code() != KafkaError._PARTITION_EOF]
                assert not [m for m in await asyncio.to_thread(c.consume, 10, 0.1) if m.error() is None]
        finally:
            c.close()
        assert KafkaError.TOPIC_AUTHORIZATION_FAILED in errors
        # only carol may delete the group; alice sees it listed, carol (admin implies describe) too
        assert ok in await asyncio.to_thread(groups_listed, address, **alice)
        error = await asyncio.to_thread(delete_group, address, ok, **alice)
        assert error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
        assert await asyncio.to_thread(delete_group, address, ok, **carol) is None
        denials = broker.metrics.registry.get_sample_value("memq_broker_denials_total", {"operation": "group"})
        assert denials and denials >= 2


async def test_the_audit_counts_what_a_kafka_consumer_group_committed(
        devcluster: DevCluster, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """A Kafka consumer carries no memq audit emitter and its Fetch names no group: the broker
    relaying its commits reports the Messages each commit covers, so the books balance for the
    group as for a memq Consumer group (each Message once, across two members' sessions)."""
    config = audit_config(dataclasses.replace(devcluster.config(cluster=unique_name("kgaudit")),
                                              broker=BrokerConfig(kafka_port=0)), unique_name)
    service = AuditService(config, db_path=str(tmp_path / "audit.db"), port=0)
    await service.start()
    group = f"audited-{uuid.uuid4().hex[:6]}"
    try:
        with broker_thread(config) as r:
            topic = r.add_topic(partitions=2, offsets="dense")   # commits map to parts through counted bases
            address = r.broker.kafka_address
            sent = rows(600, "gaudit")
            for i in range(0, len(sent), 100):   # parts in both partitions
                await asyncio.to_thread(kafka_produce, address, topic, sent[i:i + 100], acks="all")
            first = await asyncio.to_thread(group_read, address, topic, group, 250)
            rest = await asyncio.to_thread(group_read, address, topic, group, len(sent) - len(first))
            assert sorted(first + rest) == sorted(x.value for x in sent)

            def row() -> GroupSummary | None:
                rows_ = [s for s in service.auditor.read(lambda b: b.summary(int(time.time() * 1000)))
                         if s.topic == topic and s.group == group]
                return rows_[0] if rows_ else None

            await async_wait_for(lambda: (x := row()) is not None and x.produced == x.consumed == len(sent), 30,
                                 "the group's commits reported to the audit")
            x = row()
            assert x is not None and (x.lost, x.duplicates, x.mismatches) == (0, 0, 0)
    finally:
        await service.stop()


async def test_offsets_committed_through_the_old_relay_are_taken_over(
        devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    """Before memq coordinated groups it relayed them to the notification Kafka, where a group's
    offsets are under its mapped name and the notification topic: the group's first load takes
    them over, once, and the group goes on from there."""
    topic = unique_name("kmig")
    config = dataclasses.replace(devcluster.config(topics=[topic_config(topic, read_partitions=2, batch_ms=50)]),
                                 broker=BrokerConfig(kafka_port=0))
    group = f"g-{uuid.uuid4().hex[:6]}"
    async with running_broker(config) as broker:
        await asyncio.to_thread(kafka_produce, broker.kafka_address, topic, rows(20, "mig"), acks="all")
        ntopic = broker.metadata().topics[topic].notification_topic
        old = Consumer({"bootstrap.servers": config.kafka.bootstrap_servers, "group.id": mapped_group(
            config.cluster.name, group), "enable.auto.commit": False})
        try:   # what the relay stored for the group: memq's Kafka offsets, on the notification topic
            await asyncio.to_thread(old.commit, offsets=[TopicPartition(ntopic, 0, 7), TopicPartition(ntopic, 1, 3)],
                                    asynchronous=False)
        finally:
            old.close()
        assert await asyncio.to_thread(committed, broker.kafka_address, topic, group) == 7
        stored = await broker.group_coordinator.offsets(group)
        assert stored == {(topic, 0): (7, ""), (topic, 1): (3, "")}
        assert await asyncio.to_thread(delete_group, broker.kafka_address, group) is None
        assert await asyncio.to_thread(committed, broker.kafka_address, topic, group) < 0   # taken over once


@pytest.mark.parametrize("static", [True, False], ids=["static", "dynamic"])
async def test_a_sigkilled_member_restarted_has_its_partitions_back_within_10_s(
        devcluster: DevCluster, unique_name: Callable[[str], str], tmp_path: Path, static: bool) -> None:
    """A keyed stateful application (two confluent-kafka members, as Quix Streams runs them), one
    SIGKILLed and restarted, has all its partitions read again within 10 s. Static (with
    `group.instance.id`, as Kafka Streams deployments set it): the new process takes the dead
    member's place at once, long before its 30 s session ends, and the other member keeps its
    partitions (no rebalance). Dynamic (librdkafka's 45 s session): the dead member leaves the
    disconnect grace (5 s) after its connection closed, and a rebalance shares the partitions."""
    topic = unique_name("kstatic")
    config = dataclasses.replace(devcluster.config(topics=[topic_config(topic, read_partitions=4, batch_ms=50)]),
                                 broker=BrokerConfig(kafka_port=0))
    group = f"g-{uuid.uuid4().hex[:6]}"
    async with running_broker(config) as broker:
        await asyncio.to_thread(kafka_produce, broker.kafka_address, topic, rows(40, "static"), acks="all")

        def member(name: str, instance: str) -> subprocess.Popen[bytes]:
            return subprocess.Popen([sys.executable, "-m", "bench._group_member", broker.kafka_address, topic, group,
                                     "classic", str(tmp_path / f"{name}.log"), *((instance,) if static else ("", "45000"))],
                                    cwd=Path(__file__).parent.parent)

        def owned(name: str) -> frozenset[int]:
            log = member_log(tmp_path / f"{name}.log")
            return log.assignments[-1][1] if log.assignments else frozenset()

        a, b = member("a", "app-1"), member("b", "app-2")
        try:
            await async_wait_for(lambda: len(owned("a")) + len(owned("b")) == 4 and owned("a") and owned("b"),
                                 timeout_s=30, what="both members assigned")
            kept, moved = owned("a"), owned("b")
            b.kill()
            await asyncio.to_thread(b.wait, 10)
            started = time.monotonic()
            b = member("b2", "app-2")
            if static:
                await async_wait_for(lambda: owned("b2") == moved, timeout_s=10, what="the restarted member's partitions")
                assert [parts for _, parts in member_log(tmp_path / "a.log").assignments] == [kept]   # no rebalance
            else:
                await async_wait_for(lambda: owned("b2") and owned("a") | owned("b2") == {0, 1, 2, 3}
                                     and not owned("a") & owned("b2"), timeout_s=10, what="every partition read again")
            assert time.monotonic() - started < 10
        finally:   # waited off the event loop: a closing member talks to this process's broker
            for p in (a, b):
                p.terminate()
            for p in (a, b):
                await asyncio.to_thread(p.wait, 20)


async def test_a_classic_group_becomes_a_consumer_group_as_its_members_upgrade(
        devcluster: DevCluster, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """KIP-848's online migration: two classic confluent-kafka members read a 4-partition topic
    with a commit after each batch; a `group.protocol=consumer` member joins (the group becomes
    a consumer group, the classic members stay, the server's assignor deciding their partitions),
    then the classic ones are restarted as consumer-protocol members. Every record is read, none
    twice after an acknowledged commit, and ListGroups reports the group's type as consumer."""
    topic = unique_name("kupgrade")
    config = dataclasses.replace(devcluster.config(topics=[topic_config(topic, read_partitions=4, batch_ms=20)]),
                                 broker=BrokerConfig(kafka_port=0))
    group = f"g-{uuid.uuid4().hex[:6]}"
    async with running_broker(config) as broker:
        procs: dict[str, subprocess.Popen[bytes]] = {}
        sent = 0

        def member(name: str, protocol: str) -> None:
            procs[name] = subprocess.Popen([sys.executable, "-m", "bench._group_member", broker.kafka_address, topic,
                                            group, protocol, str(tmp_path / f"{name}.log")],
                                           cwd=Path(__file__).parent.parent)

        async def stop(name: str) -> None:
            procs[name].terminate()
            await asyncio.to_thread(procs[name].wait, 20)

        def read() -> list[tuple[int, int]]:
            return [r for name in procs for r in member_log(tmp_path / f"{name}.log").read]

        async def produce_and_read(tag: str) -> None:
            nonlocal sent
            await asyncio.to_thread(kafka_produce, broker.kafka_address, topic, rows(200, tag), acks="all")
            sent += 200
            await async_wait_for(lambda: len(set(read())) == sent, timeout_s=30, what=f"the {tag} records read")

        try:
            member("a", "classic")
            member("b", "classic")
            await produce_and_read("classic")
            member("c", "consumer")

            def settled(classic: int) -> bool:   # a consumer group of 3, `classic` of them classic, all reading
                g = broker.group_coordinator.consumer.groups.get(group)
                return g is not None and g.state() == "Stable" and len(g.members) == 3 \
                    and sum(m.classic is not None for m in g.members.values()) == classic \
                    and all(m.assigned for m in g.members.values())

            await async_wait_for(lambda: settled(2), timeout_s=30,
                                 what="the classic members reading in a consumer group")
            await produce_and_read("mixed")
            for old, new in (("a", "a2"), ("b", "b2")):   # restarted with the consumer protocol
                await stop(old)
                member(new, "consumer")
            await async_wait_for(lambda: settled(0), timeout_s=30, what="a plain consumer group of 3")
            await produce_and_read("upgraded")
            g = broker.group_coordinator.consumer.groups[group]
            # OffsetFetch v9 checks a member's epoch, as Kafka does
            m = next(iter(g.members.values()))
            wire = await asyncio.to_thread(Wire, broker.kafka_address)
            for epoch, error in ((m.epoch + 5, ErrorCode.STALE_MEMBER_EPOCH), (m.epoch, ErrorCode.NONE)):
                ask = OffsetFetchRequest(groups=[OffsetFetchRequest.OffsetFetchRequestGroup(
                    group_id=group, member_id=m.member_id, member_epoch=epoch, topics=None)], require_stable=False)
                got = await asyncio.to_thread(wire.call, ask, OffsetFetchResponse, 9)
                assert got.groups[0].error_code == error
            admin = AdminClient({"bootstrap.servers": broker.kafka_address})
            listed = await asyncio.to_thread(lambda: admin.list_consumer_groups(
                types={ConsumerGroupType.CONSUMER}, request_timeout=10).result(20))
            assert group in {x.group_id for x in listed.valid}
        finally:   # waited off the event loop: a closing member talks to this process's broker
            for p in procs.values():
                p.terminate()
            for p in procs.values():
                await asyncio.to_thread(p.wait, 20)
        got = read()
        assert len(set(got)) == sent
        twice = {r for r, n in Counter(got).items() if n > 1}
        uncommitted = {r for name in procs for r in member_log(tmp_path / f"{name}.log").uncommitted}
        assert twice <= uncommitted, f"read twice though committed: {sorted(twice - uncommitted)[:10]}"


async def test_a_consumer_protocol_member_subscribes_by_regex(
        devcluster: DevCluster, unique_name: Callable[[str], str]) -> None:
    """librdkafka's `^prefix.*` subscription with `group.protocol=consumer` (ConsumerGroupHeartbeat
    v1's SubscribedTopicRegex, resolved by the coordinator): it reads the matching topics, not the other."""
    prefix = unique_name("rx")
    topics = [f"{prefix}-a", f"{prefix}-b", f"other-{prefix}"]
    config = dataclasses.replace(
        devcluster.config(topics=[topic_config(t, read_partitions=2, batch_ms=20) for t in topics]),
        broker=BrokerConfig(kafka_port=0))
    async with running_broker(config) as broker:
        for t in topics:
            await asyncio.to_thread(kafka_produce, broker.kafka_address, t, rows(20, t), acks="all")

        def read() -> Counter[str]:
            c = Consumer({"bootstrap.servers": broker.kafka_address, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                          "group.protocol": "consumer", "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100})
            got: Counter[str] = Counter()
            try:
                c.subscribe([f"^{prefix}-.*"])
                deadline = time.monotonic() + 30
                while sum(got.values()) < 40:
                    assert time.monotonic() < deadline, f"read {dict(got)}"
                    got.update(m.topic() for m in c.consume(100, 0.2) if m.error() is None)
                got.update(m.topic() for m in c.consume(100, 1.0) if m.error() is None)   # nothing else comes
            finally:
                c.close()
            return got

        assert await asyncio.to_thread(read) == {topics[0]: 20, topics[1]: 20}
