"""The pure parts of memq.security: ACL decisions, token hashing and lookup, TLS contexts, and
the [security] / producer credential settings."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

import pytest
import trustme

from memq.broker.guard import Guard
from memq.broker.metrics import BrokerMetrics
from memq.config import SecurityConfig, load_config
from memq.errors import ConfigError
from memq.security.acl import IMPLIES, Operation, ResourceType, is_allowed, parse_rule, parse_rules
from memq.security.stored import SecurityLists, StoredSecurity
from memq.security.tls import client_context, server_context, subject_cn
from memq.security.tokens import hash_token, new_token, parse_entry, principal_of

RULES = parse_rules([
    "allow alice produce prefix:orders.",
    "deny alice produce literal:orders.secret",
    "allow * describe prefix:",
    "deny bob describe prefix:hr.",
    "allow carol admin literal:billing",
])


@pytest.mark.parametrize(("principal", "op", "topic", "expected"), [
    ("alice", Operation.PRODUCE, "orders.eu", True),            # prefix allow
    ("alice", Operation.PRODUCE, "orders.secret", False),       # deny wins over the prefix allow
    ("alice", Operation.PRODUCE, "payments", False),            # no allow: denied
    ("bob", Operation.PRODUCE, "orders.eu", False),             # another principal's rule
    ("bob", Operation.DESCRIBE, "orders.eu", True),             # * matches every principal
    ("bob", Operation.DESCRIBE, "hr.salaries", False),          # deny wins over *
    ("carol", Operation.ADMIN, "billing", True),                # literal
    ("carol", Operation.ADMIN, "billing2", False),              # literal is exact
    ("carol", Operation.PRODUCE, "billing", False),             # operations are separate
])
def test_acl_decisions(principal: str, op: Operation, topic: str, expected: bool) -> None:
    assert is_allowed(RULES, principal, op, topic) is expected


IMPLYING = parse_rules([
    "allow alice produce literal:sec-a",
    "allow carol admin prefix:billing.",
    "allow dave produce prefix:",
    "deny dave describe literal:hidden",
    "allow erin describe literal:t",
    "deny erin produce literal:t",
    "allow fred consume literal:logs",
])


@pytest.mark.parametrize(("principal", "op", "topic", "expected"), [
    ("alice", Operation.DESCRIBE, "sec-a", True),       # produce implies describe (Kafka: WRITE -> DESCRIBE)
    ("alice", Operation.DESCRIBE, "sec-b", False),      # ...on the topics it covers only
    ("alice", Operation.ADMIN, "sec-a", False),         # produce implies nothing else
    ("carol", Operation.DESCRIBE, "billing.eu", True),  # admin implies describe (Kafka: ALTER, DELETE)
    ("carol", Operation.PRODUCE, "billing.eu", False),  # ...but not produce
    ("dave", Operation.DESCRIBE, "orders", True),
    ("dave", Operation.DESCRIBE, "hidden", False),      # a deny of describe beats an implied allow
    ("dave", Operation.PRODUCE, "hidden", True),        # a deny names one operation: produce stays allowed
    ("erin", Operation.PRODUCE, "t", False),
    ("erin", Operation.DESCRIBE, "t", True),            # a denied produce takes away no describe allowed
    ("fred", Operation.DESCRIBE, "logs", True),         # consume implies describe (Kafka: READ -> DESCRIBE)
    ("fred", Operation.PRODUCE, "logs", False),         # ...and nothing else
])
def test_operations_imply_describe(principal: str, op: Operation, topic: str, expected: bool) -> None:
    assert is_allowed(IMPLYING, principal, op, topic) is expected


def test_describe_implies_nothing() -> None:
    only_describe = parse_rules(["allow alice describe prefix:"])
    assert not any(is_allowed(only_describe, "alice", op, "t")
                   for op in (Operation.PRODUCE, Operation.CONSUME, Operation.ADMIN))
    assert IMPLIES[Operation.PRODUCE] == {Operation.DESCRIBE} and Operation.DESCRIBE not in IMPLIES


def test_no_rules_deny_everything() -> None:
    assert not is_allowed((), "alice", Operation.PRODUCE, "t")


@pytest.mark.parametrize("line", ["allow alice produce", "permit alice produce literal:t",
                                  "allow alice write literal:t", "allow alice produce regex:t",
                                  "allow alice produce literal:", "allow alice consume groups:g",
                                  "allow alice consume group:"])
def test_bad_acl_lines_name_the_setting(line: str) -> None:
    with pytest.raises(ConfigError, match=r"security\.acls"):
        parse_rule(line)


def test_rule_round_trips_through_its_line() -> None:
    assert str(parse_rule("Deny bob DESCRIBE prefix:hr.")) == "deny bob describe prefix:hr."
    for line in ("allow bob consume group:etl", "deny * admin group-prefix:prod."):
        assert str(parse_rule(line)) == line


GROUPS = parse_rules([
    "allow alice consume group-prefix:etl.",
    "deny alice consume group:etl.secret",
    "allow bob describe group:etl.daily",
    "allow carol admin group:etl.daily",
    "allow dave consume literal:etl.daily",      # a topic rule: no group of that name
])


@pytest.mark.parametrize(("principal", "op", "group", "expected"), [
    ("alice", Operation.CONSUME, "etl.daily", True),      # Kafka's READ on the group: join, commit, ...
    ("alice", Operation.DESCRIBE, "etl.daily", True),     # READ implies DESCRIBE
    ("alice", Operation.CONSUME, "etl.secret", False),    # deny wins
    ("alice", Operation.ADMIN, "etl.daily", False),       # DELETE is admin's
    ("bob", Operation.DESCRIBE, "etl.daily", True),
    ("bob", Operation.CONSUME, "etl.daily", False),
    ("carol", Operation.ADMIN, "etl.daily", True),
    ("dave", Operation.CONSUME, "etl.daily", False),      # topic rules never cover groups
])
def test_group_rules_are_about_groups_only(principal: str, op: Operation, group: str, expected: bool) -> None:
    assert is_allowed(GROUPS, principal, op, group, ResourceType.GROUP) is expected
    if principal == "alice":   # ... and group rules never cover topics
        assert not is_allowed(GROUPS, principal, op, group)


def test_a_group_a_door_refuses_counts_one_group_denial_and_asking_alone_counts_none() -> None:
    metrics = BrokerMetrics("b1")
    guard = Guard(SecurityConfig(enabled=True, acls=("allow alice consume group:g",)), metrics.denials)
    assert guard.allowed_group("alice", Operation.CONSUME, "g")
    assert not guard.may_group("bob", Operation.CONSUME, "g")
    assert not guard.allowed_group("bob", Operation.CONSUME, "g")
    assert metrics.registry.get_sample_value("memq_broker_denials_total", {"operation": "group"}) == 1


def test_tokens_are_random_stored_hashed_and_matched() -> None:
    token, entry = new_token("alice")
    token2, _ = new_token("alice")
    assert token != token2 and len(token) > 40
    assert entry.digest == hash_token(token) and token not in str(entry)
    entries = (parse_entry(str(entry)), parse_entry(str(new_token("bob")[1])))
    assert principal_of(token, entries) == "alice"
    assert principal_of(token + "x", entries) is None
    assert principal_of(token, entries[1:]) is None       # revoked: its entry removed


@pytest.mark.parametrize("line", ["alice", "alice:1234", ":" + "a" * 64, "alice:" + "g" * 64])
def test_bad_token_entries_are_rejected(line: str) -> None:
    with pytest.raises(ConfigError, match=r"security\.tokens"):
        parse_entry(line)


def test_principal_names_are_checked() -> None:
    with pytest.raises(ConfigError):
        new_token("a b")


def test_tls_contexts_from_files(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file, ca_file = tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    server = server_context(str(cert_file), str(key_file), str(ca_file))
    assert server.verify_mode == ssl.CERT_OPTIONAL
    assert client_context(str(ca_file)).verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(ConfigError, match="tls_key_file"):
        server_context(str(cert_file), str(ca_file))   # a CA cert is no private key
    assert subject_cn({"subject": ((("commonName", "alice"),),)}) == "alice"
    assert subject_cn(None) is None


def test_security_settings_are_validated(tmp_path: Path) -> None:
    assert not load_config(env={}).security.enabled          # off by default
    with pytest.raises(ConfigError, match=r"security\.tls_cert_file = '/nope': no such file"):
        load_config(env={"MEMQ_SECURITY_TLS_CERT_FILE": "/nope", "MEMQ_SECURITY_TLS_KEY_FILE": "/nope"})
    with pytest.raises(ConfigError, match=r"producer\.tls_ca_file"):
        load_config(env={"MEMQ_PRODUCER_TLS_CA_FILE": str(tmp_path / "missing.pem")})
    with pytest.raises(ConfigError, match=r"security\.acls\[1\]"):
        load_config(env={"MEMQ_SECURITY_ACLS": "allow a produce literal:t, allow b delete literal:t"})
    f = tmp_path / "memq.toml"
    f.write_text('[security]\nenabled = true\nacls = ["allow a produce literal:t", "deny a describe prefix:"]\n'
                 '[producer]\ntoken = "memq_secret"\n')
    config = load_config(f, env={})
    assert config.security.acls == ("allow a produce literal:t", "deny a describe prefix:")
    assert "memq_secret" not in repr(config.producer)


def test_stored_security_document_round_trips_and_is_checked() -> None:
    alice = str(new_token("alice")[1])
    stored = StoredSecurity((alice,), ("allow alice produce literal:t",))
    assert StoredSecurity.from_json(stored.to_json(), "zk") == stored
    assert StoredSecurity.from_json(None, "zk") == StoredSecurity() == StoredSecurity.from_json(b"", "zk")
    edited = stored.edited("acls", lambda old: [*old, "deny * describe prefix:hr."])
    assert edited.acls == ("allow alice produce literal:t", "deny * describe prefix:hr.") and edited.tokens == (alice,)
    assert stored.edited("tokens", lambda old: []).tokens == ()
    with pytest.raises(ConfigError, match="stored acls"):
        stored.edited("acls", lambda old: ["allow alice write literal:t"])      # never written
    with pytest.raises(ConfigError, match="no list 'quotas'"):
        stored.edited("quotas", lambda old: old)


@pytest.mark.parametrize(("data", "match"), [
    (b"{", "zk: not JSON"),
    (b"[]", "zk: not a JSON object"),
    (b'{"v": 2, "tokens": []}', "not a version 1 security document"),
    (b'{"v": 1, "tokens": "alice:00"}', "must be lists of strings"),
    (b'{"v": 1, "tokens": ["alice:00"]}', r"zk: stored tokens\[0\]"),
])
def test_bad_stored_security_documents_name_the_znode(data: bytes, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        StoredSecurity.from_json(data, "zk")


def test_guard_uses_the_config_and_the_stored_lists() -> None:
    from prometheus_client import CollectorRegistry, Counter

    from memq.broker.guard import Guard
    from memq.config import SecurityConfig

    admin, admin_entry = new_token("admin")
    alice, alice_entry = new_token("alice")
    guard = Guard(SecurityConfig(enabled=True, tokens=(str(admin_entry),), acls=("allow admin admin prefix:",)),
                  Counter("d", "d", ["operation"], registry=CollectorRegistry()))
    assert not guard.may("alice", Operation.PRODUCE, "t")
    guard.use_stored(StoredSecurity((str(alice_entry),), ("allow alice produce literal:t",)))
    assert guard.may("alice", Operation.PRODUCE, "t") and guard.may("admin", Operation.ADMIN, "t")
    guard.use_stored(StoredSecurity())                                 # removed: the config file's stay
    assert not guard.may("alice", Operation.PRODUCE, "t") and guard.may("admin", Operation.ADMIN, "t")


def test_guard_shows_describable_topics_and_refuses_named_ones_alike_existing_or_not() -> None:
    from prometheus_client import CollectorRegistry, Counter

    from memq.broker.guard import Guard
    from memq.config import SecurityConfig
    from memq.format.metadata import ClusterMetadata, StorageMetadata, TopicMetadata, TopicRefusal

    md = ClusterMetadata("c", "b1", "k:1", StorageMetadata(),
                         topics={n: TopicMetadata(n, f"memq.c.{n}", 1, ("http://b1",)) for n in ("sec-a", "sec-b")})
    rules = ("allow alice produce literal:sec-a",)
    denials = Counter("d", "d", ["operation"], registry=CollectorRegistry())
    guard = Guard(SecurityConfig(enabled=True, acls=rules), denials)
    seen = guard.visible("alice", md, ["sec-a", "sec-b", "ghost", "sec-b"])
    assert set(seen.topics) == {"sec-a"}                                  # produce implies describe
    refusal = TopicRefusal("alice", "describe")
    assert seen.refused == {"sec-b": refusal, "ghost": refusal}          # existing or not: the same
    assert denials.labels("describe")._value.get() == 2
    assert guard.visible("alice", md, []).refused == {}                  # a plain listing refuses nothing
    assert Guard(SecurityConfig(), denials).visible(None, md, ["sec-b"]) is md   # security off


def test_security_lists_edit_through_any_store() -> None:
    """The five admin operations over an in-memory `edit` (as over a file or ZooKeeper)."""
    doc = StoredSecurity()

    def edit(key: str, change: Callable[[list[str]], list[str]]) -> tuple[list[str], list[str]]:
        nonlocal doc
        old = list(getattr(doc, key))
        doc = doc.edited(key, change)
        return old, list(getattr(doc, key))

    lists = SecurityLists(edit, "memory")
    alice, bob = str(new_token("alice")[1]), str(new_token("bob")[1])
    for entry in (alice, bob, str(new_token("alice")[1])):
        lists.add_token(entry)
    assert lists.revoke("alice") == 2 and doc.tokens == (bob,) and lists.revoke("alice") == 0
    assert lists.add_rule("allow alice produce literal:t") and not lists.add_rule("ALLOW alice  Produce literal:t")
    assert lists.rules() == ["allow alice produce literal:t"]
    assert lists.remove_rule("allow alice PRODUCE literal:t") == 1 and lists.rules() == []
