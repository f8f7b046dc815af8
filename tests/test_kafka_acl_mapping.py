"""Kafka ACL bindings <-> memq ACL rules (memq.security.kafka_acl): what maps, what is refused
and why, and Kafka's filter matching over memq's rules."""

from __future__ import annotations

import pytest

from memq.errors import InvalidInputError
from memq.security.acl import Operation, is_allowed, parse_rule, parse_rules
from memq.security.kafka_acl import (Binding, BindingFilter, KafkaOperation as Op, KafkaPattern as Pat,
                                     KafkaPermission as Perm, KafkaResource as Res, binding, binding_filter,
                                     bindings_of, described, matching, rules_of)


def make(resource: Res, name: str, op: Op, *, pattern: Pat = Pat.LITERAL, principal: str = "User:alice",
         permission: Perm = Perm.ALLOW, host: str = "*") -> Binding:
    return binding(resource, name, pattern, principal, host, op, permission)


def lines(b: Binding) -> list[str]:
    return [str(r) for r in rules_of(b)]


@pytest.mark.parametrize(("b", "want"), [
    (make(Res.TOPIC, "orders", Op.WRITE), ["allow alice produce literal:orders"]),
    (make(Res.TOPIC, "orders", Op.READ), ["allow alice consume literal:orders"]),
    (make(Res.TOPIC, "orders", Op.DESCRIBE_CONFIGS), ["allow alice describe literal:orders"]),
    (make(Res.TOPIC, "orders.", Op.DELETE, pattern=Pat.PREFIXED), ["allow alice admin prefix:orders."]),
    (make(Res.TOPIC, "*", Op.READ, principal="User:*"), ["allow * consume prefix:"]),
    (make(Res.GROUP, "etl", Op.READ), ["allow alice consume group:etl"]),
    (make(Res.GROUP, "etl-", Op.DELETE, pattern=Pat.PREFIXED), ["allow alice admin group-prefix:etl-"]),
    (make(Res.CLUSTER, "kafka-cluster", Op.ALTER), ["allow alice admin literal:__cluster"]),
    (make(Res.TOPIC, "orders", Op.WRITE, permission=Perm.DENY), ["deny alice produce literal:orders"]),
    (make(Res.TOPIC, "orders", Op.ALL), [f"allow alice {op} literal:orders" for op in Operation]),
    (make(Res.CLUSTER, "kafka-cluster", Op.ALL), ["allow alice describe literal:__cluster",
                                                  "allow alice admin literal:__cluster"]),
])
def test_bindings_become_the_memq_rules_granting_them(b: Binding, want: list[str]) -> None:
    assert lines(b) == want
    for rule in rules_of(b):        # and each such rule lists the binding back
        assert b in bindings_of(rule) or b.operation is Op.ALL


def test_a_created_binding_is_enforced_as_kafka_means_it() -> None:
    rules = rules_of(make(Res.TOPIC, "orders", Op.WRITE))
    assert is_allowed(rules, "alice", Operation.PRODUCE, "orders")
    assert is_allowed(rules, "alice", Operation.DESCRIBE, "orders")       # WRITE implies DESCRIBE
    assert not is_allowed(rules, "alice", Operation.CONSUME, "orders")
    assert not is_allowed(rules, "bob", Operation.PRODUCE, "orders")
    star = rules_of(make(Res.TOPIC, "*", Op.READ))
    assert is_allowed(star, "alice", Operation.CONSUME, "anything")


@pytest.mark.parametrize(("b", "why"), [
    (dict(principal="Group:ops"), "User:NAME"),
    (dict(principal="alice"), "User:NAME"),
    (dict(principal="User:"), "non-empty"),
    (dict(host="10.0.0.1"), "only '*'"),
    (dict(resource=Res.TRANSACTIONAL_ID), "topics, groups and the cluster"),
    (dict(resource=Res.USER), "topics, groups and the cluster"),
    (dict(op=Op.IDEMPOTENT_WRITE), "IDEMPOTENT_WRITE on TOPIC"),
    (dict(resource=Res.CLUSTER, name="kafka-cluster", op=Op.IDEMPOTENT_WRITE), "memq has no such right"),
    (dict(resource=Res.CLUSTER, name="kafka-cluster", op=Op.CLUSTER_ACTION), "memq has no such right"),
    (dict(resource=Res.CLUSTER, name="other"), "LITERAL 'kafka-cluster'"),
    (dict(resource=Res.GROUP, op=Op.ALTER), "ALTER on GROUP"),
    (dict(name="a b"), "no spaces"),
    (dict(op=Op.ALTER, name="*"), "admin on the cluster"),            # prefix: covers __cluster
    (dict(op=Op.ALL, name="__", pattern=Pat.PREFIXED), "admin on the cluster"),
])
def test_what_memq_cannot_hold_is_refused_naming_why(b: dict[str, object], why: str) -> None:
    fields: dict[str, object] = dict(resource=Res.TOPIC, name="orders", op=Op.WRITE) | b
    with pytest.raises(InvalidInputError, match=why):
        rules_of(make(fields.pop("resource"), fields.pop("name"), fields.pop("op"), **fields))  # type: ignore[arg-type]


@pytest.mark.parametrize(("fields", "why"), [
    ((Res.ANY, "t", Pat.LITERAL, "User:a", "*", Op.READ, Perm.ALLOW), "resource type cannot be ANY"),
    ((Res.TOPIC, "t", Pat.MATCH, "User:a", "*", Op.READ, Perm.ALLOW), "pattern type cannot be MATCH"),
    ((Res.TOPIC, "t", Pat.LITERAL, "User:a", "*", Op.ANY, Perm.ALLOW), "operation cannot be ANY"),
    ((Res.TOPIC, "t", Pat.LITERAL, "User:a", "*", Op.READ, Perm.UNKNOWN), "permission type cannot be UNKNOWN"),
    ((Res.TOPIC, "", Pat.LITERAL, "User:a", "*", Op.READ, Perm.ALLOW), "resource name"),
    ((Res.TOPIC, "t", Pat.LITERAL, "User:a", "*", 99, Perm.ALLOW), "operation 99 is not one Kafka defines"),
    ((Res.TOPIC, "t", Pat.LITERAL, None, "*", Op.READ, Perm.ALLOW), "cannot be null"),
])
def test_a_binding_with_filter_values_is_not_a_binding(fields: tuple, why: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidInputError, match=why):
        binding(*fields)


def test_rules_list_as_every_binding_they_grant() -> None:
    assert [b.operation for b in bindings_of(parse_rule("allow alice admin literal:t"))] == [
        Op.CREATE, Op.DELETE, Op.ALTER, Op.ALTER_CONFIGS]
    [b] = bindings_of(parse_rule("deny * consume group-prefix:etl"))
    assert b == Binding(Res.GROUP, "etl", Pat.PREFIXED, "User:*", Op.READ, Perm.DENY)
    [b] = bindings_of(parse_rule("allow bob produce prefix:"))
    assert (b.resource, b.name, b.pattern) == (Res.TOPIC, "*", Pat.LITERAL)
    cluster = bindings_of(parse_rule("allow root admin literal:__cluster"))
    assert {(b.resource, b.name) for b in cluster} == {(Res.CLUSTER, "kafka-cluster")}
    assert [b.operation for b in cluster] == [Op.CREATE, Op.ALTER, Op.ALTER_CONFIGS]
    # a topic prefix covering __cluster grants on the cluster too: listed, not hidden
    dev = bindings_of(parse_rule("allow dev admin prefix:"))
    assert {b.resource for b in dev} == {Res.CLUSTER, Res.TOPIC}


RULES = parse_rules(["allow alice produce literal:orders", "allow alice consume prefix:ord",
                     "deny bob consume literal:orders", "allow * describe prefix:",
                     "allow carol consume group:etl", "allow root admin literal:__cluster"])


def show(found: list[Binding]) -> set[tuple[str, str, str, str, str]]:
    return {(b.resource.name, b.name, b.pattern.name, b.principal, b.operation.name) for b in found}


def test_filters_match_as_kafka_s_do() -> None:
    everything = described(RULES, BindingFilter())
    assert len(everything) == 1 + 1 + 1 + 2 + 2 + 1 + 3
    assert show(described(RULES, BindingFilter(Res.TOPIC, "orders", Pat.LITERAL))) == {
        ("TOPIC", "orders", "LITERAL", "User:alice", "WRITE"), ("TOPIC", "orders", "LITERAL", "User:bob", "READ")}
    # MATCH: every binding that applies to the name: literal, wildcard and covering prefixes
    assert show(described(RULES, BindingFilter(Res.TOPIC, "orders", Pat.MATCH, operation=Op.READ))) == {
        ("TOPIC", "ord", "PREFIXED", "User:alice", "READ"), ("TOPIC", "orders", "LITERAL", "User:bob", "READ")}
    assert ("TOPIC", "*", "LITERAL", "User:*", "DESCRIBE") in show(
        described(RULES, BindingFilter(Res.TOPIC, "orders", Pat.MATCH)))
    assert show(described(RULES, BindingFilter(Res.TOPIC, "ord", Pat.ANY, "User:alice"))) == {
        ("TOPIC", "ord", "PREFIXED", "User:alice", "READ")}
    assert show(described(RULES, BindingFilter(Res.GROUP))) == {("GROUP", "etl", "LITERAL", "User:carol", "READ")}
    denied = described(RULES, BindingFilter(permission=Perm.DENY))
    assert [b.principal for b in denied] == ["User:bob"]
    assert described(RULES, BindingFilter(host="10.0.0.1")) == []
    assert described(RULES, BindingFilter(Res.TRANSACTIONAL_ID)) == []
    assert show(described(RULES, BindingFilter(Res.CLUSTER, operation=Op.ALTER))) == {
        ("CLUSTER", "kafka-cluster", "LITERAL", "User:root", "ALTER")}
    assert show(described(RULES, BindingFilter(Res.CLUSTER, principal="User:*"))) == {   # `prefix:` covers it
        ("CLUSTER", "kafka-cluster", "LITERAL", "User:*", "DESCRIBE"),
        ("CLUSTER", "kafka-cluster", "LITERAL", "User:*", "DESCRIBE_CONFIGS")}


def test_delete_matches_whole_rules_and_all_matches_every_operation() -> None:
    admin = parse_rules(["allow alice admin literal:t", "allow alice produce literal:t", "allow bob admin literal:t"])
    by_delete = matching(admin, BindingFilter(Res.TOPIC, "t", Pat.LITERAL, "User:alice", operation=Op.DELETE))
    assert [str(r) for r in by_delete] == ["allow alice admin literal:t"]
    by_all = matching(admin, BindingFilter(Res.TOPIC, "t", Pat.LITERAL, "User:alice", operation=Op.ALL))
    assert len(by_all) == 2
    assert matching(admin, BindingFilter(Res.TOPIC, "t", Pat.PREFIXED)) == []


def test_filters_refuse_unknown_values() -> None:
    f = binding_filter(Res.ANY, None, Pat.ANY, None, None, Op.ANY, Perm.ANY)
    assert f == BindingFilter()
    for fields in ((Res.UNKNOWN, None, Pat.ANY, None, None, Op.ANY, Perm.ANY),
                   (Res.ANY, None, Pat.ANY, None, None, Op.UNKNOWN, Perm.ANY),
                   (Res.ANY, None, 17, None, None, Op.ANY, Perm.ANY)):
        with pytest.raises(InvalidInputError):
            binding_filter(*fields)
