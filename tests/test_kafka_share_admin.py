"""Share groups' admin calls on a broker's Kafka listener, on the real dev cluster (moto S3, tansu,
ZooKeeper): Describe-, Alter- and DeleteShareGroupOffsets through the protocol (confluent-kafka
2.16's AdminClient has no call for them), ListGroups and DescribeGroups answering for share
groups, and the group ACLs of the share APIs over SASL/PLAIN."""

from __future__ import annotations

import asyncio
import dataclasses
import struct
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, ConsumerGroupType, KafkaError, KafkaException, ShareConsumer
from confluent_kafka.admin import AdminClient
from tests.support.waiting import wait_for
from tests.support.kafka_clients import Running, broker_thread, kafka_produce, rows
from tests.support.security import ALICE, ALICE_ENTRY, BOB, BOB_ENTRY
from tests.support.share_frames import (ShareClient, cstr, alter_offsets_body, delete_offsets_body, describe_offsets_body,
                                        heartbeat_body, list_groups_body, parse_changed_offsets, parse_describe_offsets,
                                        parse_heartbeat, parse_list_groups_v5, parse_share_ack, parse_share_fetch, share_ack_body, share_fetch_body)

from memq.config import BrokerConfig, MemqConfig, SecurityConfig, ShareConfig, TopicConfig
from memq.security.tokens import new_token
from memq.devcluster import DevCluster
from memq.kafka_api.metadata_flex import topic_id

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND, UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUEST = 68, 69, 3, 42
GROUP_AUTHORIZATION_FAILED = 30
CAROL, CAROL_ENTRY = new_token("carol")


def share_config(devcluster: DevCluster, cluster: str) -> MemqConfig:
    base = devcluster.config(cluster=cluster)
    return dataclasses.replace(
        base, broker=BrokerConfig(kafka_port=0),
        zookeeper=dataclasses.replace(base.zookeeper, enabled=True),
        share=ShareConfig(auto_offset_reset="earliest", heartbeat_interval_ms=500, session_timeout_ms=10_000,
                          flush_ms=20))


@pytest.fixture(scope="module")
def running(devcluster: DevCluster) -> Iterator[Running]:
    with broker_thread(share_config(devcluster, "kshareadmin")) as r:
        yield r


class Member:
    """One share-group member over the byte-level client: joins, fetches, acknowledges, leaves."""

    def __init__(self, client: ShareClient, group: str, topic: str, tid: uuid.UUID) -> None:
        self.client, self.group, self.key = client, group, (tid, 0)
        hb = parse_heartbeat(client.call(76, heartbeat_body(group, "", 0, [topic])))
        assert hb.error == 0 and hb.member_id
        self.id, self.epoch = hb.member_id, 0

    def fetch(self, n: int) -> list[int]:
        """The offsets of `n` records acquired (fetching until they are there)."""
        got: list[int] = []
        for _ in range(30):
            f = parse_share_fetch(self.client.call(78, share_fetch_body(self.group, self.id, self.epoch,
                                                                        {self.key: []}, max_wait_ms=1000)))
            assert f.error == 0 and f.parts[self.key].error == 0
            self.epoch += 1
            for first, last, _ in f.parts[self.key].acquired:
                got += [first + i for i in range(last - first + 1)]   # one part: consecutive offsets
            if len(got) >= n:
                return got
        raise AssertionError(f"acquired {len(got)} of {n}")

    def accept(self, first: int, last: int) -> None:
        _, errors = parse_share_ack(self.client.call(79, share_ack_body(self.group, self.id, self.epoch, {self.key: [(first, last, 1)]})))
        self.epoch += 1
        assert errors == {self.key: 0}

    def leave(self) -> None:
        self.client.call(78, share_fetch_body(self.group, self.id, -1, {}, max_records=0))
        assert parse_heartbeat(self.client.call(76, heartbeat_body(self.group, self.id, -1, None))).epoch == -1


def test_describe_alter_and_delete_a_share_group_s_start_offsets(running: Running) -> None:
    topic = running.add_topic(partitions=1)
    tid = topic_id(running.config.cluster.name, topic)
    kafka_produce(running.broker.kafka_address, topic, rows(10, "adm"), acks="all")
    g = f"sga-{uuid.uuid4().hex[:8]}"
    client = ShareClient(running.broker.kafka_address)
    try:
        def describe() -> dict[tuple[str, int], tuple[int, int]]:
            answer = parse_describe_offsets(client.call(90, describe_offsets_body({g: {topic: [0]}}), 0))[g]
            assert answer.error == 0, answer.message
            return answer.starts

        m = Member(client, g, topic, tid)
        offsets = m.fetch(10)
        m.accept(offsets[0], offsets[3])
        assert describe() == {(topic, 0): (offsets[4], 0)}   # the first record not finished
        # a group with an active member: refused, nothing changed
        err, parts = parse_changed_offsets(client.call(91, alter_offsets_body(g, {topic: {0: offsets[7]}}), 0))
        assert (err, parts) == (NON_EMPTY_GROUP, {})
        assert parse_changed_offsets(client.call(92, delete_offsets_body(g, {topic: [0]}), 0))[0] == NON_EMPTY_GROUP
        assert describe() == {(topic, 0): (offsets[4], 0)}
        m.leave()

        # empty: the start moves, durably (the ZooKeeper store has it), and the next member starts there
        err, parts = parse_changed_offsets(client.call(
            91, alter_offsets_body(g, {topic: {0: offsets[7], 5: 0}}), 0))
        assert err == 0 and parts == {(topic, 0): 0, (topic, 5): UNKNOWN_TOPIC_OR_PARTITION}
        stored = running.broker.shares.store.read((g, topic, 0))
        assert stored is not None and (stored.start, stored.end, stored.runs) == (offsets[7], offsets[7], ())
        assert describe() == {(topic, 0): (offsets[7], 0)}
        everything = parse_describe_offsets(client.call(90, describe_offsets_body({g: None}), 0))[g]
        assert everything.starts == {(topic, 0): (offsets[7], 0)}   # null topics: every share-partition with state
        m = Member(client, g, topic, tid)
        assert m.fetch(3)[:3] == offsets[7:10]
        m.leave()

        # deleted: the group starts again by its reset policy (earliest here)
        err, parts = parse_changed_offsets(client.call(92, delete_offsets_body(g, {topic: [0]}), 0))
        assert (err, parts) == (0, {(topic, 0): 0})
        assert describe() == {(topic, 0): (-1, 0)}
        m = Member(client, g, topic, tid)
        assert m.fetch(10)[:10] == offsets
        m.leave()

        # a negative start, a group never seen, a frame cut short
        err, parts = parse_changed_offsets(client.call(91, alter_offsets_body(g, {topic: {0: -5}}), 0))
        assert (err, parts) == (0, {(topic, 0): INVALID_REQUEST})
        assert parse_describe_offsets(client.call(90, describe_offsets_body({"sga-none": None}), 0))[
            "sga-none"].error == GROUP_ID_NOT_FOUND
        assert parse_changed_offsets(client.call(91, alter_offsets_body(g, {topic: {0: 1}})[:-6], 0))[0] == INVALID_REQUEST
    finally:
        client.close()


@pytest.mark.filterwarnings("ignore:list_groups:DeprecationWarning")   # the one call listing every group type
def test_admin_tools_list_and_describe_share_groups_beside_consumer_groups(running: Running) -> None:
    topic = running.add_topic(partitions=1)
    tid = topic_id(running.config.cluster.name, topic)
    address = running.broker.kafka_address
    kafka_produce(address, topic, rows(5, "lst"), acks="all")
    g, classic = f"sgl-{uuid.uuid4().hex[:8]}", f"cg-{uuid.uuid4().hex[:8]}"
    c = Consumer({"bootstrap.servers": address, "group.id": classic, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    client = ShareClient(address)
    try:
        c.subscribe([topic])
        wait_for(lambda: bool(c.consume(10, 0.5)), 60, "the consumer group read")
        c.commit(asynchronous=False)
        m = Member(client, g, topic, tid)
        admin = AdminClient({"bootstrap.servers": address})
        # Kafka's listing (ListGroups, then DescribeGroups of each): both groups, the share one by its type
        groups = {str(x.id): x for x in admin.list_groups(timeout=30)}
        assert groups[g].protocol_type == "share" and groups[classic].protocol_type == "consumer"
        assert groups[g].state == "Stable" and [x.id for x in groups[g].members] == [m.id]
        assert groups[g].members[0].client_id == "test"
        # the consumer-group calls (librdkafka keeps only consumer groups in the list) do not break on it
        result = admin.list_consumer_groups(request_timeout=20).result(30)
        listed = {x.group_id: x for x in result.valid}
        assert result.errors == [] and g not in listed and listed[classic].type == ConsumerGroupType.CLASSIC
        # ListGroups v5 names each group's type, and its filters apply to share groups too
        error, every = parse_list_groups_v5(client.call(16, list_groups_body([], []), 5))
        assert error == 0 and every[g] == ("share", "Stable", "share") and every[classic][0] == "consumer"
        only = parse_list_groups_v5(client.call(16, list_groups_body([], ["share"]), 5))[1]
        assert only[g] == every[g] and classic not in only and {t for _, _, t in only.values()} == {"share"}
        assert g not in parse_list_groups_v5(client.call(16, list_groups_body(["Empty"], []), 5))[1]
        described = admin.describe_consumer_groups([g, classic], request_timeout=20)
        with pytest.raises(KafkaException, match="not a consumer group"):   # its own answer, refused by the client
            described[g].result(30)
        assert described[classic].result(30).group_id == classic
        m.leave()
        assert [x.state for x in admin.list_groups(g, timeout=30)] == ["Empty"]
    finally:
        c.close()
        client.close()


def test_group_acls_decide_who_joins_fetches_describes_and_resets_a_share_group(devcluster: DevCluster) -> None:
    ok, other = f"sgok-{uuid.uuid4().hex[:6]}", f"sgno-{uuid.uuid4().hex[:6]}"
    topic = f"kacl-{uuid.uuid4().hex[:6]}"
    base = share_config(devcluster, "ksharegacl")
    config = dataclasses.replace(base, security=SecurityConfig(
        enabled=True, tokens=(str(ALICE_ENTRY), str(BOB_ENTRY), str(CAROL_ENTRY)),
        acls=(f"allow alice consume literal:{topic}", f"allow alice consume group:{ok}",
              f"allow bob consume literal:{topic}", f"allow bob describe group:{ok}",
              f"allow carol consume literal:{topic}", f"allow carol admin group:{ok}")))
    with broker_thread(config) as running:
        asyncio.run_coroutine_threadsafe(running.broker.add_topic(TopicConfig(name=topic, read_partitions=1)),
                                         running.loop).result(30)
        tid = topic_id(config.cluster.name, topic)
        clients = {name: ShareClient(running.broker.kafka_address) for name in ("alice", "bob", "carol")}
        try:
            for name, token in (("alice", ALICE), ("bob", BOB), ("carol", CAROL)):
                assert clients[name].sasl_plain(name, token) == 0
            alice, bob, carol = clients["alice"], clients["bob"], clients["carol"]
            m = Member(alice, ok, topic, tid)   # consume on the group: a member, fetching
            assert m.fetch(0) == []
            assert parse_heartbeat(alice.call(76, heartbeat_body(other, "", 0, [topic]))).error == GROUP_AUTHORIZATION_FAILED
            # describe on the group: bob sees it, but is no member and may not fetch or acknowledge in it
            assert parse_heartbeat(bob.call(76, heartbeat_body(ok, "", 0, [topic]))).error == GROUP_AUTHORIZATION_FAILED
            assert parse_share_fetch(bob.call(78, share_fetch_body(ok, m.id, 0, {(tid, 0): []}))).error \
                == GROUP_AUTHORIZATION_FAILED
            assert parse_share_ack(bob.call(79, share_ack_body(ok, m.id, 1, {(tid, 0): [(0, 0, 1)]})))[0] \
                == GROUP_AUTHORIZATION_FAILED
            assert m.id.encode() in bob.call(77, bytes([2]) + cstr(ok) + b"\0\0")
            refused = alice.call(77, bytes([2]) + cstr(other) + b"\0\0")
            # size, correlation id, header tags, throttle time, one group: its error code
            assert struct.unpack_from(">h", refused, 14)[0] == GROUP_AUTHORIZATION_FAILED
            assert parse_describe_offsets(bob.call(90, describe_offsets_body({ok: {topic: [0]}}), 0))[ok].error == 0
            assert parse_describe_offsets(bob.call(90, describe_offsets_body({other: None}), 0))[other].error \
                == GROUP_AUTHORIZATION_FAILED
            # admin on the group to reset it: not alice (consume), not bob (describe); carol, once it is empty
            for who in (alice, bob):
                assert parse_changed_offsets(who.call(91, alter_offsets_body(ok, {topic: {0: 0}}), 0))[0] \
                    == GROUP_AUTHORIZATION_FAILED
                assert parse_changed_offsets(who.call(92, delete_offsets_body(ok, {topic: [0]}), 0))[0] \
                    == GROUP_AUTHORIZATION_FAILED
            m.leave()
            assert parse_changed_offsets(carol.call(91, alter_offsets_body(ok, {topic: {0: 0}}), 0)) == (0, {(topic, 0): 0})
            assert parse_changed_offsets(carol.call(92, delete_offsets_body(ok, {topic: [0]}), 0)) == (0, {(topic, 0): 0})
        finally:
            for c in clients.values():
                c.close()


def test_share_consumers_over_sasl_need_consume_on_the_group(devcluster: DevCluster) -> None:
    ok, topic = f"sgok-{uuid.uuid4().hex[:6]}", f"kacl-{uuid.uuid4().hex[:6]}"
    config = dataclasses.replace(share_config(devcluster, "ksharesasl"), security=SecurityConfig(
        enabled=True, tokens=(str(ALICE_ENTRY), str(BOB_ENTRY)),
        acls=(f"allow alice produce literal:{topic}", f"allow alice consume literal:{topic}",
              f"allow alice consume group:{ok}", f"allow bob consume literal:{topic}",
              f"allow bob describe group:{ok}")))
    with broker_thread(config) as running:
        asyncio.run_coroutine_threadsafe(running.broker.add_topic(TopicConfig(name=topic, read_partitions=1,
                                                                              batch_ms=50)), running.loop).result(30)
        address = running.broker.kafka_address

        def consumer(user: str, password: str) -> ShareConsumer:
            c = ShareConsumer({"bootstrap.servers": address, "group.id": ok, "security.protocol": "SASL_PLAINTEXT",
                               "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": password})
            c.subscribe([topic])
            return c

        kafka_produce(address, topic, rows(20, "sasl"), acks="all", **{
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "alice",
            "sasl.password": ALICE})
        bob = consumer("bob", BOB)   # consume on the topic, describe on the group: not a member, reads nothing
        errors: list[int] = []
        try:
            deadline = time.monotonic() + 30
            while not errors and time.monotonic() < deadline:
                for m in bob.poll(0.5) or []:
                    assert m.error() is not None, "bob read a record"
                    errors.append(m.error().code())
        except KafkaException as e:
            errors.append(e.args[0].code())
        finally:
            bob.close()
        assert KafkaError.GROUP_AUTHORIZATION_FAILED in errors, errors
        alice, got = consumer("alice", ALICE), []
        try:
            deadline = time.monotonic() + 60
            while len(got) < 20:
                assert time.monotonic() < deadline, f"alice read {len(got)} of 20"
                for m in alice.poll(0.5) or []:
                    assert m.error() is None, m.error()
                    got.append(m.value())
        finally:
            alice.close()
        assert len(set(got)) == 20
