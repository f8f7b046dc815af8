"""Tokens and ACLs kept in ZooKeeper: `memq token` / `memq acl` write them there, a running,
secured broker process applies each change without a restart (bounded waits, real Producer)."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from memq.cli import main
from memq.client.producer import Delivery, Producer
from memq.config import MemqConfig, ProducerConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster
from memq.devcluster.secure import DevSecurity, make_dev_security
from memq.errors import MemqError
from memq.governor.security_store import SecurityStore
from memq.security.tls import client_context
from memq.security.tokens import new_token
from tests.support.cluster import read_stored
from tests.support.readback import readback_report

pytestmark = pytest.mark.integration

APPLY_TIMEOUT_S = 15.0
OK = "ok"
"""What `send` answers when its Message was acked: the whole answer, never a part of an error's text
("broker" and "token" hold "ok": a refusal matched a substring "ok", and a test believed a Message
that was never stored had been acked)."""


@pytest.fixture
def secured(devcluster: DevCluster, tmp_path: Path,
            unique_name: Callable[[str], str]) -> Iterator[tuple[GovernedCluster, DevSecurity, Path]]:
    """One secured broker process on ZooKeeper (its own cluster name), and its client config file."""
    security = make_dev_security(tmp_path / "tls")
    with GovernedCluster(tmp_path / "run", brokers=1, servers=devcluster, cluster=unique_name("zsec"),
                         security=security) as gc:
        yield gc, security, gc.write_client_config(tmp_path / "memq.toml")


def send(config: MemqConfig, token: str, topic: str, value: bytes,
         acks: list[tuple[bytes, Delivery]] | None = None) -> str:
    """OK, or the error a fresh Producer (a new connection) with `token` gets; each ack is
    added to `acks` (where the broker said the Message went)."""
    async def run() -> str:
        pc = ProducerConfig(brokers=config.producer.brokers, tls_ca_file=config.producer.tls_ca_file, token=token,
                            linger_ms=1, retries=0, request_timeout_ms=5_000, delivery_timeout_ms=10_000)
        async with Producer(pc) as p:
            delivery = await (await p.send(topic, value))
        if acks is not None:
            acks.append((value, delivery))
        return OK
    try:
        return asyncio.run(run())
    except MemqError as e:
        return f"{type(e).__name__}: {e}"


def answered(got: str, want: str) -> bool:
    """`got` is the answer `want`: exactly OK for an acked send, else an error whose text holds `want`."""
    return got == OK if want == OK else got != OK and want in got


def until(probe: Callable[[], str], want: str) -> str:
    """`probe()` once it answers `want`, retried for at most APPLY_TIMEOUT_S (the broker applies
    stored rules from a ZooKeeper watch: a send right after `memq acl add` may come first)."""
    deadline = time.monotonic() + APPLY_TIMEOUT_S
    while not answered(got := probe(), want):
        assert time.monotonic() < deadline, f"not applied within {APPLY_TIMEOUT_S}s: {got!r}"
        time.sleep(0.3)
    return got


def test_stored_tokens_and_acls_apply_without_restart(secured: tuple[GovernedCluster, DevSecurity, Path]) -> None:
    gc, security, path = secured
    topic = "orders"
    gc.create_topic(TopicConfig(name=topic, read_partitions=1))
    client = gc.config()

    def memq(*args: str) -> Result:
        """The CLI as an operator with ZooKeeper access and no credentials: it edits ZooKeeper."""
        return CliRunner().invoke(main, ["--config", str(path), *args], catch_exceptions=False,
                                  env={"MEMQ_PRODUCER_TOKEN": ""})

    # every send that was acked (a send while a change is applied may still be taken): those, and
    # only those, are stored
    acks: list[tuple[bytes, Delivery]] = []
    created = memq("token", "create", "alice")
    assert created.exit_code == 0, created.output
    token = created.output.splitlines()[1]
    assert "ZooKeeper" in created.output and "brokers apply it at once" in created.output
    stored, _version = SecurityStore(gc.registry).read()
    assert len(stored.tokens) == 1 and token not in stored.to_json().decode()   # only its hash
    # a known token that may see the topic but has no produce rule: denied, nothing written
    assert memq("acl", "add", "allow", "alice", "describe", f"literal:{topic}").exit_code == 0
    until(lambda: send(client, token, topic, acks=acks, value=b"no-rule"), f"principal alice may not produce to topic {topic}")
    assert memq("acl", "add", "allow", "alice", "produce", f"literal:{topic}").exit_code == 0
    until(lambda: send(client, token, topic, acks=acks, value=b"allowed"), OK)
    listed = memq("acl", "list").output.splitlines()
    assert listed[:2] == [f"allow alice describe literal:{topic}", f"allow alice produce literal:{topic}"]
    assert "allow dev admin prefix:" in listed                     # the config file's rules follow
    assert memq("acl", "remove", "allow", "alice", "produce", f"literal:{topic}").exit_code == 0
    until(lambda: send(client, token, topic, acks=acks, value=b"removed-rule"), "AuthorizationError")
    missing = memq("acl", "remove", "allow", "alice", "produce", f"literal:{topic}")
    assert missing.exit_code == 2 and "no rule" in missing.output
    assert memq("acl", "add", "allow", "alice", "produce", f"literal:{topic}").exit_code == 0
    until(lambda: send(client, token, topic, acks=acks, value=b"allowed-again"), OK)
    revoked = memq("token", "revoke", "alice")
    assert revoked.exit_code == 0 and "revoked 1 token(s) of alice" in revoked.output
    until(lambda: send(client, token, topic, acks=acks, value=b"revoked"), "rejected the token")
    values = sorted(v for _, v, _ in asyncio.run(read_stored(client, topic))[0].values())
    assert {b"allowed", b"allowed-again"} <= {v for v, _ in acks}
    assert sorted(values) == sorted(v for v, _ in acks)


def test_produce_alone_is_enough_and_no_rule_is_refused_at_once(
        secured: tuple[GovernedCluster, DevSecurity, Path]) -> None:
    """Issue 31's two scenarios as an operator sets them up: `memq token create alice`, `memq acl
    add allow alice produce literal:sec-a`. alice writes to sec-a at once (produce implies
    describe); to sec-b, or a topic that does not exist, she is refused at once by name, never
    left to wait producer.max_block_ms (60 s) for a topic 'not hosted by any broker'."""
    gc, _security, path = secured
    for topic in ("sec-a", "sec-b"):
        gc.create_topic(TopicConfig(name=topic, read_partitions=1))

    def memq(*args: str) -> Result:
        return CliRunner().invoke(main, ["--config", str(path), *args], catch_exceptions=False,
                                  env={"MEMQ_PRODUCER_TOKEN": ""})

    token = memq("token", "create", "alice").output.splitlines()[1]
    assert memq("acl", "add", "allow", "alice", "produce", "literal:sec-a").exit_code == 0
    client = gc.config()
    acks: list[tuple[bytes, Delivery]] = []
    until(lambda: send(client, token, "sec-a", b"applied", acks), OK)      # the stored rules reached the broker
    for topic, want in (("sec-a", OK),
                        ("sec-b", "AuthorizationError: principal alice may not describe topic sec-b"),
                        ("no-such-topic", "AuthorizationError: principal alice may not describe topic no-such-topic")):
        start = time.monotonic()
        assert answered(got := send(client, token, topic, b"at-once", acks), want), (topic, got)
        assert time.monotonic() - start < 10.0, topic                 # not max_block_ms (60 s)
    assert [v for v, _ in acks] == [b"applied", b"at-once"]
    stored, dups, _ = asyncio.run(read_stored(client, "sec-a"))
    # every acked Message stored under its own identity (a send refused or timed out before the
    # rules applied is not acked; one that timed out may still be stored: values, not counts)
    lost = [(v, d) for v, d in acks if stored.get((d.producer_id, d.epoch, d.sequence, d.position), (None, b"", ()))[1] != v]
    assert not lost and {v for _, v, _ in stored.values()} == {b"applied", b"at-once"}, (
        f"acked but not stored: {[v for v, _ in lost]}; duplicates {dups}\n"
        + asyncio.run(readback_report(client, "sec-a", acks)))


def test_a_broker_starts_with_the_stored_tokens(devcluster: DevCluster, tmp_path: Path,
                                                unique_name: Callable[[str], str]) -> None:
    """Tokens and ACLs stored before a broker starts work on its first request (read before it listens)."""
    security = make_dev_security(tmp_path / "tls")
    with GovernedCluster(tmp_path / "run", brokers=1, servers=devcluster, cluster=unique_name("zsec"),
                         security=security) as gc:
        topic = "early"
        gc.create_topic(TopicConfig(name=topic, read_partitions=1))
        store = SecurityStore(gc.registry)
        token, entry = new_token("bob")
        store.edit("tokens", lambda old: [*old, str(entry)])
        store.edit("acls", lambda old: [*old, f"allow bob produce literal:{topic}", f"allow bob describe literal:{topic}"])
        gc.restart_broker("b1")
        gc.wait_placed(topic)
        assert send(gc.config(), token, topic, b"first") == "ok"


def test_admin_operations_need_admin_on_the_topic_or_cluster(
        secured: tuple[GovernedCluster, DevSecurity, Path]) -> None:
    """With credentials the CLI administers through the brokers' admin API; a principal without
    `admin` on the topic (or the cluster, for tokens and ACLs) is refused by name, nothing changes."""
    gc, security, path = secured

    def memq(*args: str, token: str = security.token) -> Result:
        return CliRunner().invoke(main, ["--config", str(path), *args], catch_exceptions=False,
                                  env={"MEMQ_PRODUCER_TOKEN": token})

    made = memq("topic", "create", "shared", "-p", "1")
    assert made.exit_code == 0 and "served by b1" in made.output, made.output
    alice = memq("token", "create", "alice").output.splitlines()[1]
    assert "the brokers' admin API" in memq("acl", "add", "allow", "alice", "describe", "prefix:").output

    denied = 0   # as the broker counts them: `until` below may see a denial more than once

    def as_alice(*args: str) -> str:
        nonlocal denied
        got = memq(*args, token=alice)
        denied += "principal alice may not admin" in got.output
        return f"exit {got.exit_code}: {got.output}"

    until(lambda: as_alice("topic", "create", "alice.t1", "-p", "1"),
          "AuthorizationError: principal alice may not admin topic alice.t1")
    assert "alice.t1" not in gc.registry.topics()
    assert memq("acl", "add", "allow", "alice", "admin", "prefix:alice.").exit_code == 0
    until(lambda: as_alice("topic", "create", "alice.t1", "-p", "1"), "exit 0")
    assert "exit 0" in as_alice("topic", "alter", "alice.t1", "--set", "expected_mbps=3")
    assert gc.registry.topic("alice.t1").expected_mbps == 3
    refused = {
        "may not admin topic shared": [("topic", "alter", "shared", "--set", "expected_mbps=9"),
                                       ("governor", "topic", "delete", "shared", "--yes")],
        "may not admin the cluster": [("acl", "add", "allow", "alice", "admin", "prefix:"),
                                      ("acl", "remove", "allow", "alice", "describe", "prefix:"),
                                      ("token", "create", "mallory"), ("token", "revoke", "dev"),
                                      ("acl", "list")],
    }
    for words, commands in refused.items():
        for command in commands:
            answer = as_alice(*command)
            assert answer.startswith("exit 1") and f"principal alice {words}" in answer, (command, answer)
    assert gc.registry.topic("shared").expected_mbps == 1.0          # nothing changed
    stored, _ = SecurityStore(gc.registry).read()
    assert [e.partition(":")[0] for e in stored.tokens] == ["alice"]
    assert stored.acls == ("allow alice describe prefix:", "allow alice admin prefix:alice.")
    assert "exit 0" in as_alice("governor", "topic", "delete", "alice.t1", "--yes", "--delete-notifications")
    assert "alice.t1" not in gc.registry.topics()
    metrics = urllib.request.urlopen(gc.broker("b1").url + "/metrics", timeout=10,
                                     context=client_context(security.ca_file)).read().decode()
    assert denied >= 8 and f'memq_broker_denials_total{{operation="admin"}} {denied:.1f}' in metrics, denied
