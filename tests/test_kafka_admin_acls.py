"""Kafka's ACL calls on a real governed cluster with security on (ZooKeeper, TLS, SASL/PLAIN with
memq tokens): an ACL created with confluent-kafka's AdminClient is memq's rule, enforced on
both doors (Kafka produce and memq's WebSocket producer), listed by `memq acl list` and by
DescribeAcls, and DeleteAcls takes it back; kafka-python's KafkaAdminClient does the same;
what memq cannot hold, and callers without `admin` on the cluster, are refused by Kafka's codes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import KafkaException
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                   ResourcePatternType, ResourceType)
from kafka.admin import ACL, ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType, KafkaAdminClient
from kafka.admin import ResourcePattern, ResourcePatternFilter
from kafka.admin import ResourceType as KpResourceType
from kafka.errors import ClusterAuthorizationFailedError, NoError, SecurityDisabledError

from memq.cli import main
from memq.client._auth import BrokerAuth
from memq.client.cluster import fetch_metadata
from memq.client.producer import Producer
from memq.config import BrokerConfig, MemqConfig, ProducerConfig, SecurityConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster
from memq.devcluster.secure import make_dev_security
from memq.errors import MemqError
from tests.support.cluster import running_broker
from tests.support.security import ALICE, ALICE_ENTRY, BOB, BOB_ENTRY, kafka_send, sasl
from tests.support.kafka_frames import request
from tests.support.share_frames import flex_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

APPLY_TIMEOUT_S = 15.0    # brokers apply stored rules from a ZooKeeper watch
OK = "ok"


@dataclass(frozen=True)
class Secured:
    gc: GovernedCluster
    address: str          # the broker's Kafka listener (SASL_SSL)
    ca: str
    dev_token: str        # principal `dev`: every right, admin on the cluster included
    cli_config: Path


@pytest.fixture(scope="module")
def secured(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    tmp = tmp_path_factory.mktemp("kacl")
    dev = make_dev_security(tmp / "tls")
    security = dataclasses.replace(dev, security=dataclasses.replace(
        dev.security, tokens=(*dev.security.tokens, str(ALICE_ENTRY), str(BOB_ENTRY))))
    with GovernedCluster(tmp / "run", brokers=1, servers=devcluster, cluster=f"kacl{uuid.uuid4().hex[:6]}",
                         security=security, broker=BrokerConfig(kafka_port=0)) as gc:
        client = gc.config()
        [broker] = fetch_metadata(gc.broker("b1").url, 10, BrokerAuth.of(client.producer)).brokers
        yield Secured(gc, broker.kafka_address, dev.ca_file, dev.token, gc.write_client_config(tmp / "memq.toml"))


def admin(s: Secured, user: str = "dev", password: str | None = None) -> AdminClient:
    return AdminClient({"bootstrap.servers": s.address, **sasl(s.ca, user, password or s.dev_token)})


def kafka_produce(s: Secured, user: str, password: str, topic: str) -> str:
    """OK, or the delivery error a confluent-kafka producer of `user` gets."""
    delivery, _ = kafka_send(s.address, topic, b"v", **sasl(s.ca, user, password), **{"message.timeout.ms": 5_000})
    return delivery[0] if delivery else OK


def memq_produce(s: Secured, token: str, topic: str) -> str:
    """OK, or the error memq's own Producer (the WebSocket door) with `token` gets."""
    async def run() -> str:
        config = s.gc.config().producer
        pc = ProducerConfig(brokers=config.brokers, tls_ca_file=config.tls_ca_file, token=token, linger_ms=1,
                            retries=0, request_timeout_ms=5_000, delivery_timeout_ms=10_000)
        async with Producer(pc) as p:
            await (await p.send(topic, b"v"))
        return OK
    try:
        return asyncio.run(run())
    except MemqError as e:
        return f"{type(e).__name__}: {e}"


def until(probe: Callable[[], str], want: str) -> str:
    """`probe()` once it answers `want` (OK exactly, else an error holding it), within APPLY_TIMEOUT_S."""
    deadline = time.monotonic() + APPLY_TIMEOUT_S
    while True:
        got = probe()
        if (got == OK) if want == OK else (got != OK and want in got):
            return got
        assert time.monotonic() < deadline, f"not {want!r} within {APPLY_TIMEOUT_S}s: {got!r}"
        time.sleep(0.3)


def acl_list(s: Secured) -> list[str]:
    """`memq acl list` as an operator with ZooKeeper access (no token: it reads the store itself)."""
    done = CliRunner().invoke(main, ["--config", str(s.cli_config), "acl", "list"], catch_exceptions=False,
                              env={"MEMQ_PRODUCER_TOKEN": ""})
    assert done.exit_code == 0, done.output
    return done.output.splitlines()


def topic_acls(topic: str, principal: str | None = None) -> AclBindingFilter:
    return AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.MATCH, principal, None,
                            AclOperation.ANY, AclPermissionType.ANY)


def shown(bindings: list[Any]) -> set[tuple[str, str, str, str]]:
    return {(b.name, b.principal, b.operation.name, b.permission_type.name) for b in bindings}


def test_an_acl_created_over_kafka_is_enforced_on_both_doors_listed_and_deleted(secured: Secured) -> None:
    s, topic = secured, f"kacl-{uuid.uuid4().hex[:6]}"
    s.gc.create_topic(TopicConfig(name=topic, read_partitions=1))
    assert "TOPIC_AUTHORIZATION_FAILED" in kafka_produce(s, "alice", ALICE, topic)
    assert "AuthorizationError" in memq_produce(s, ALICE, topic)

    a = admin(s)
    created = [AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:alice", "*", op,
                          AclPermissionType.ALLOW) for op in (AclOperation.WRITE, AclOperation.READ)]
    for future in a.create_acls(created, request_timeout=20).values():
        assert future.result(30) is None
    until(lambda: kafka_produce(s, "alice", ALICE, topic), OK)
    until(lambda: memq_produce(s, ALICE, topic), OK)
    assert "TOPIC_AUTHORIZATION_FAILED" in kafka_produce(s, "bob", BOB, topic)       # only alice was granted
    assert "AuthorizationError" in memq_produce(s, BOB, topic)

    listed = acl_list(s)
    assert f"allow alice produce literal:{topic}" in listed and f"allow alice consume literal:{topic}" in listed
    assert "allow dev admin prefix:" in listed                    # the config file's, after the stored ones
    described = a.describe_acls(topic_acls(topic), request_timeout=20).result(30)
    assert {(topic, "User:alice", "WRITE", "ALLOW"), (topic, "User:alice", "READ", "ALLOW")} <= shown(described)
    assert ("*", "User:dev", "WRITE", "ALLOW") in shown(described)     # `prefix:` is Kafka's wildcard, matched

    [deleted] = a.delete_acls([AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL,
                                                "User:alice", None, AclOperation.ANY, AclPermissionType.ANY)],
                              request_timeout=20).values()
    assert shown(deleted.result(30)) == {(topic, "User:alice", "WRITE", "ALLOW"), (topic, "User:alice", "READ", "ALLOW")}
    assert not [line for line in acl_list(s) if topic in line]
    assert a.describe_acls(topic_acls(topic, "User:alice"), request_timeout=20).result(30) == []
    until(lambda: kafka_produce(s, "alice", ALICE, topic), "TOPIC_AUTHORIZATION_FAILED")
    until(lambda: memq_produce(s, ALICE, topic), "AuthorizationError")


def test_unmappable_bindings_and_callers_without_cluster_admin_are_refused(secured: Secured) -> None:
    s, a = secured, admin(secured)

    def create_error(b: AclBinding) -> str:
        [future] = a.create_acls([b], request_timeout=20).values()
        with pytest.raises(KafkaException) as e:
            future.result(30)
        return f"{e.value.args[0].name()}: {e.value.args[0].str()}"

    def topic_binding(**change: Any) -> AclBinding:
        fields: dict[str, Any] = dict(restype=ResourceType.TOPIC, name="t", resource_pattern_type=ResourcePatternType.LITERAL,
                                      principal="User:alice", host="*", operation=AclOperation.WRITE,
                                      permission_type=AclPermissionType.ALLOW) | change
        return AclBinding(**fields)

    assert "INVALID_REQUEST" in (got := create_error(topic_binding(principal="Group:ops"))) and "User:NAME" in got
    assert "only '*'" in create_error(topic_binding(host="10.0.0.1"))
    assert "topics, groups and the cluster" in create_error(topic_binding(restype=ResourceType.TRANSACTIONAL_ID))
    assert "admin on the cluster" in create_error(topic_binding(name="*", operation=AclOperation.ALTER))
    assert not [line for line in acl_list(s) if line.endswith(":t")]     # nothing of them was stored

    # the config file's rules are listed, never deleted: the filter's answer says so per binding
    [result] = a.delete_acls([AclBindingFilter(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.MATCH,
                                               "User:dev", None, AclOperation.ANY, AclPermissionType.ANY)],
                             request_timeout=20).values()
    with pytest.raises(KafkaException) as e:
        result.result(30)
    assert e.value.args[0].name() == "POLICY_VIOLATION" and "config file" in e.value.args[0].str()
    assert "allow dev admin prefix:" in acl_list(s)       # ...and the rule still in force

    # librdkafka drops DescribeAcls' error code (a refusal reads as an empty list): nothing is revealed;
    # kafka-python reads the code (test_kafka_python_admin_...); CreateAcls' per-binding codes arrive
    alice = admin(s, "alice", ALICE)
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                                  AclPermissionType.ANY)
    assert a.describe_acls(everything, request_timeout=20).result(30)           # dev's rules, seen by dev
    assert alice.describe_acls(everything, request_timeout=20).result(30) == []
    [future] = alice.create_acls([topic_binding(principal="User:alice")], request_timeout=20).values()
    with pytest.raises(KafkaException) as e:
        future.result(30)
    assert e.value.args[0].name() == "CLUSTER_AUTHORIZATION_FAILED"


def kafka_python_admin(address: str, **conf: Any) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=address, request_timeout_ms=20_000, **conf)


def test_kafka_python_admin_creates_describes_and_deletes(secured: Secured) -> None:
    s, topic = secured, f"kpacl-{uuid.uuid4().hex[:6]}"
    tls = dict(security_protocol="SASL_SSL", sasl_mechanism="PLAIN", ssl_cafile=s.ca)
    client = kafka_python_admin(s.address, sasl_plain_username="dev", sasl_plain_password=s.dev_token, **tls)
    alice = kafka_python_admin(s.address, sasl_plain_username="alice", sasl_plain_password=ALICE, **tls)
    try:
        acl = ACL("User:bob", "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                  ResourcePattern(KpResourceType.GROUP, f"{topic}-", ACLResourcePatternType.PREFIXED))
        refused = ACL("User:bob", "*", ACLOperation.IDEMPOTENT_WRITE, ACLPermissionType.ALLOW,
                      ResourcePattern(KpResourceType.CLUSTER, "kafka-cluster", ACLResourcePatternType.LITERAL))
        result = client.create_acls([acl, refused])
        assert result["succeeded"] == [acl] and [e.__name__ for e in result["failed"]] == ["InvalidRequestError"]
        assert f"allow bob consume group-prefix:{topic}-" in acl_list(s)
        bob = ACLFilter("User:bob", None, ACLOperation.ANY, ACLPermissionType.ANY,
                        ResourcePatternFilter(KpResourceType.GROUP, f"{topic}-x", ACLResourcePatternType.MATCH))
        found, _ = client.describe_acls(bob)
        assert [(a.resource_pattern.resource_name, a.operation) for a in found] == [(f"{topic}-", ACLOperation.READ)]
        with pytest.raises(ClusterAuthorizationFailedError):
            alice.describe_acls(bob)
        [(_, removed, error)] = client.delete_acls([bob])
        assert error is NoError and [a.operation for a in removed] == [ACLOperation.READ]
        assert f"allow bob consume group-prefix:{topic}-" not in acl_list(s)
    finally:
        client.close()
        alice.close()


def test_kafkajs_admin_creates_describes_and_deletes(secured: Secured, kafkajs: Path) -> None:  # noqa: F811
    s, topic = secured, f"jsacl-{uuid.uuid4().hex[:6]}"
    args = {"broker": s.address, "ca": s.ca, "user": "dev", "password": s.dev_token, "topic": topic}
    done = subprocess.run(["node", str(Path(__file__).with_name("support") / "kafkajs_acls.js"), json.dumps(args)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "NODE_PATH": str(kafkajs)})
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    write = [topic, "User:bob", 4]                            # Kafka's WRITE
    assert got == {"described": [write], "removed": [write], "after": []}
    assert f"allow bob produce literal:{topic}" not in acl_list(s)


async def test_with_security_off_the_calls_answer_security_disabled(devcluster: DevCluster) -> None:
    config: MemqConfig = dataclasses.replace(devcluster.config(), broker=BrokerConfig(kafka_port=0),
                                             security=SecurityConfig(enabled=False))
    async with running_broker(config) as broker:
        def calls() -> tuple[str, str]:
            client = kafka_python_admin(broker.kafka_address)
            try:
                with pytest.raises(SecurityDisabledError) as e:
                    client.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                                   ResourcePatternFilter(KpResourceType.ANY, None,
                                                                         ACLResourcePatternType.ANY)))
            finally:
                client.close()
            confluent = AdminClient({"bootstrap.servers": broker.kafka_address})   # held: its futures die with it
            [future] = confluent.create_acls([AclBinding(
                ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.READ,
                AclPermissionType.ALLOW)], request_timeout=20).values()
            with pytest.raises(KafkaException) as created:
                future.result(30)
            return type(e.value).__name__, created.value.args[0].name()
        assert await asyncio.to_thread(calls) == ("SecurityDisabledError", "SECURITY_DISABLED")

        def garbage(key: int, version: int, body: bytes) -> bytes:
            """What a frame of `body` gets: b"" when the broker closed the connection (it does not parse)."""
            host, port = broker.kafka_address.rsplit(":", 1)
            frame = (flex_request if version >= 2 else request)(key, version, 7, body)
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(frame)
                return sock.recv(65536)
        for key in (29, 30, 31):                      # DescribeAcls, CreateAcls, DeleteAcls
            for version in (1, 3):
                for body in (b"", b"\x02", b"\xff" * 7):
                    assert await asyncio.to_thread(garbage, key, version, body) == b"", (key, version, body)
        assert await asyncio.to_thread(calls) == ("SecurityDisabledError", "SECURITY_DISABLED")   # serving on
