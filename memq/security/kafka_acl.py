"""Kafka's ACL bindings as memq's ACL rules and back (pure: no I/O).

Kafka's admin calls (DescribeAcls, CreateAcls, DeleteAcls) speak bindings: a resource (type,
name, pattern type), a principal `User:NAME`, a host, an operation and a permission. memq keeps
rules (`memq.security.acl`): `allow|deny NAME produce|consume|describe|admin literal:|prefix:|
group:|group-prefix:`. The mapping, so Kafka's tools and `memq acl` see one set of rules:

- Principal `User:NAME` is memq's `NAME`, `User:*` its `*`; other principal types are refused.
- Resources: TOPIC is a topic pattern, GROUP a group pattern, CLUSTER (`kafka-cluster`) memq's
  cluster resource `literal:__cluster`. LITERAL is `literal:`, PREFIXED `prefix:`, and Kafka's
  wildcard name `*` (LITERAL) is the empty prefix. Other resource types are refused.
- Operations (`KAFKA_OPERATIONS`): a memq operation stands for the Kafka operations it grants,
  e.g. `admin` on a topic for CREATE, DELETE, ALTER and ALTER_CONFIGS. Creating any of them
  stores the one memq rule, and a rule is listed as every binding it grants (so DELETE granted
  shows ALTER too: memq grants them together). ALL is every memq operation on the resource; as
  a filter it matches them all. memq's implication rules are Kafka's (WRITE, READ, ALTER ...
  imply DESCRIBE), so nothing implied is listed.
- ALLOW and DENY are memq's allow and deny; host `*` only (memq's rules do not look at hosts).
- A topic pattern that also covers `__cluster` (e.g. the wildcard) lists the CLUSTER bindings its
  operation grants there too; creating `admin` through one is refused, as it would grant admin
  on the cluster (tokens, ACLs) under a topic's name.

What cannot be mapped raises InvalidInputError naming why: it is refused, never dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import TypeVar

from memq.errors import InvalidInputError
from memq.security.acl import (ANY_PRINCIPAL, CLUSTER_RESOURCE, AclRule, Operation, PatternType, Permission,
                               ResourceType)

USER = "User:"
WILDCARD = "*"
ANY_HOST = "*"
CLUSTER_NAME = "kafka-cluster"   # the one name of Kafka's CLUSTER resource

E = TypeVar("E", bound=IntEnum)


class KafkaResource(IntEnum):
    """Kafka's resource types (ANY only in a filter)."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class KafkaPattern(IntEnum):
    """Kafka's resource pattern types (ANY and MATCH only in a filter)."""

    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class KafkaOperation(IntEnum):
    """Kafka's ACL operations (ANY only in a filter)."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class KafkaPermission(IntEnum):
    """Kafka's permission types (ANY only in a filter)."""

    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


K = KafkaOperation
#: memq operation -> the Kafka operations an allow (or deny) of it grants (or denies), per
#: resource type. Each Kafka operation appears at most once per resource: it names one memq one.
KAFKA_OPERATIONS: Mapping[KafkaResource, Mapping[Operation, tuple[KafkaOperation, ...]]] = {
    KafkaResource.TOPIC: {Operation.PRODUCE: (K.WRITE,), Operation.CONSUME: (K.READ,),
                          Operation.DESCRIBE: (K.DESCRIBE, K.DESCRIBE_CONFIGS),
                          Operation.ADMIN: (K.CREATE, K.DELETE, K.ALTER, K.ALTER_CONFIGS)},
    KafkaResource.GROUP: {Operation.PRODUCE: (K.WRITE,), Operation.CONSUME: (K.READ,),
                          Operation.DESCRIBE: (K.DESCRIBE,), Operation.ADMIN: (K.DELETE,)},
    KafkaResource.CLUSTER: {Operation.DESCRIBE: (K.DESCRIBE, K.DESCRIBE_CONFIGS),
                            Operation.ADMIN: (K.CREATE, K.ALTER, K.ALTER_CONFIGS)},
}
_PERMISSION = {Permission.ALLOW: KafkaPermission.ALLOW, Permission.DENY: KafkaPermission.DENY}
_MEMQ_PERMISSION = {v: k for k, v in _PERMISSION.items()}
_RESOURCE = {ResourceType.TOPIC: KafkaResource.TOPIC, ResourceType.GROUP: KafkaResource.GROUP}
_MEMQ_RESOURCE = {v: k for k, v in _RESOURCE.items()}


@dataclass(frozen=True, slots=True)
class Binding:
    """One Kafka ACL binding (Kafka's AclBinding)."""

    resource: KafkaResource
    name: str
    pattern: KafkaPattern
    principal: str
    operation: KafkaOperation
    permission: KafkaPermission
    host: str = ANY_HOST


@dataclass(frozen=True, slots=True)
class BindingFilter:
    """A Kafka ACL binding filter (Kafka's AclBindingFilter): None and ANY match anything."""

    resource: KafkaResource = KafkaResource.ANY
    name: str | None = None
    pattern: KafkaPattern = KafkaPattern.ANY
    principal: str | None = None
    operation: KafkaOperation = KafkaOperation.ANY
    permission: KafkaPermission = KafkaPermission.ANY
    host: str | None = None

    def matches(self, b: Binding) -> bool:
        """Kafka's matching (ResourcePatternFilter, AccessControlEntryFilter), with ALL as ANY:
        memq has no ALL rule, ALL stands for every memq operation on the resource."""
        return (self.resource in (KafkaResource.ANY, b.resource) and self._matches_pattern(b)
                and self.principal in (None, b.principal) and self.host in (None, b.host)
                and self.operation in (KafkaOperation.ANY, KafkaOperation.ALL, b.operation)
                and self.permission in (KafkaPermission.ANY, b.permission))

    def _matches_pattern(self, b: Binding) -> bool:
        if self.pattern not in (KafkaPattern.ANY, KafkaPattern.MATCH, b.pattern):
            return False
        if self.name is None:
            return True
        if self.pattern in (KafkaPattern.ANY, b.pattern):
            return self.name == b.name
        if b.pattern is KafkaPattern.LITERAL:   # MATCH: the bindings that apply to the name
            return self.name == b.name or b.name == WILDCARD
        return self.name.startswith(b.name)


def _enum(kind: type[E], value: int, what: str) -> E:
    try:
        return kind(value)
    except ValueError:
        raise InvalidInputError(f"{what} {value} is not one Kafka defines") from None


def binding(resource: int, name: str, pattern: int, principal: str, host: str, operation: int,
            permission: int) -> Binding:
    """A binding to create, from a request's fields; InvalidInputError when it is not a whole one
    (ANY, MATCH or UNKNOWN in it, an empty name, a null string), as Kafka refuses it."""
    if not all(isinstance(v, str) for v in (name, principal, host)):
        raise InvalidInputError("an ACL binding's resource name, principal and host cannot be null")
    b = Binding(_enum(KafkaResource, resource, "resource type"), name, _enum(KafkaPattern, pattern, "pattern type"),
                principal, _enum(KafkaOperation, operation, "operation"),
                _enum(KafkaPermission, permission, "permission type"), host)
    for field, value in (("resource type", b.resource), ("pattern type", b.pattern), ("operation", b.operation),
                         ("permission type", b.permission)):
        if value.name in ("UNKNOWN", "ANY", "MATCH"):
            raise InvalidInputError(f"an ACL binding's {field} cannot be {value.name} (only a filter's)")
    if not name:
        raise InvalidInputError("an ACL binding needs a resource name")
    return b


def binding_filter(resource: int, name: str | None, pattern: int, principal: str | None, host: str | None,
                   operation: int, permission: int) -> BindingFilter:
    """A filter from a request's fields; InvalidInputError on UNKNOWN or a value Kafka does not
    define (Kafka's 'the filter must not contain UNKNOWN elements')."""
    f = BindingFilter(_enum(KafkaResource, resource, "resource type"), name,
                      _enum(KafkaPattern, pattern, "pattern type"), principal,
                      _enum(KafkaOperation, operation, "operation"),
                      _enum(KafkaPermission, permission, "permission type"), host)
    for field, value in (("resource type", f.resource), ("pattern type", f.pattern), ("operation", f.operation),
                         ("permission type", f.permission)):
        if value.name == "UNKNOWN":
            raise InvalidInputError(f"an ACL filter's {field} cannot be UNKNOWN")
    return f


# --- Kafka -> memq ---------------------------------------------------------------------------------


def rules_of(b: Binding) -> tuple[AclRule, ...]:
    """The memq rules that grant (or deny) what `b` does: one, or one per memq operation for ALL;
    InvalidInputError naming why when memq cannot hold `b`."""
    principal = _memq_principal(b.principal)
    if b.host != ANY_HOST:
        raise InvalidInputError(f"host {b.host!r}: memq's ACLs do not depend on the client's host, only '*' is served")
    permission = _MEMQ_PERMISSION[b.permission]
    resource, pattern_type, pattern = _memq_pattern(b)
    operations = _memq_operations(b.resource, b.operation)
    rules = tuple(AclRule(permission, principal, op, pattern_type, pattern, resource) for op in operations)
    if b.resource is not KafkaResource.CLUSTER:
        for rule in rules:
            if rule.operation is Operation.ADMIN and _covers_cluster(rule):
                raise InvalidInputError(
                    f"{b.resource.name} {b.pattern.name} {b.name!r} is memq's {_target(rule)}, which also covers "
                    f"the cluster resource {CLUSTER_RESOURCE} (tokens and ACLs): {b.operation.name} there would grant "
                    "admin on the cluster; name the topics by a prefix not covering it, and the cluster as CLUSTER")
    return rules


def _memq_principal(principal: str) -> str:
    kind, sep, name = principal.partition(":")
    if not sep or f"{kind}:" != USER:
        raise InvalidInputError(f"principal {principal!r}: memq's principals are {USER}NAME (a token's or a "
                                "certificate's name) or User:*")
    if not name or any(c.isspace() for c in name):
        raise InvalidInputError(f"principal {principal!r}: the name must be non-empty, without spaces")
    return ANY_PRINCIPAL if name == WILDCARD else name


def _memq_pattern(b: Binding) -> tuple[ResourceType, PatternType, str]:
    if b.resource is KafkaResource.CLUSTER:
        if b.pattern is not KafkaPattern.LITERAL or b.name != CLUSTER_NAME:
            raise InvalidInputError(f"the CLUSTER resource is LITERAL {CLUSTER_NAME!r}, not "
                                    f"{b.pattern.name} {b.name!r}")
        return ResourceType.TOPIC, PatternType.LITERAL, CLUSTER_RESOURCE
    if b.resource not in _MEMQ_RESOURCE:
        raise InvalidInputError(f"resource type {b.resource.name}: memq's ACLs are on topics, groups and the "
                                "cluster only")
    if any(c.isspace() for c in b.name):
        raise InvalidInputError(f"resource name {b.name!r}: memq's ACL resources have no spaces in their names")
    if b.pattern is KafkaPattern.LITERAL and b.name == WILDCARD:
        return _MEMQ_RESOURCE[b.resource], PatternType.PREFIX, ""
    return _MEMQ_RESOURCE[b.resource], (PatternType.LITERAL if b.pattern is KafkaPattern.LITERAL
                                        else PatternType.PREFIX), b.name


def _memq_operations(resource: KafkaResource, operation: KafkaOperation) -> tuple[Operation, ...]:
    table = KAFKA_OPERATIONS[resource]
    if operation is KafkaOperation.ALL:
        return tuple(table)
    found = tuple(op for op, granted in table.items() if operation in granted)
    if not found:
        served = ", ".join(k.name for ks in table.values() for k in ks)
        raise InvalidInputError(f"operation {operation.name} on {resource.name}: memq has no such right there "
                                f"(served: ALL, {served})")
    return found


# --- memq -> Kafka ---------------------------------------------------------------------------------


def _covers_cluster(rule: AclRule) -> bool:
    return rule.resource is ResourceType.TOPIC and rule.covers(rule.principal, CLUSTER_RESOURCE)


def _target(rule: AclRule) -> str:
    return str(rule).rsplit(" ", 1)[1]


def bindings_of(rule: AclRule) -> tuple[Binding, ...]:
    """Every Kafka binding `rule` grants (or denies), in Kafka's operation order."""
    if rule.resource not in _RESOURCE:
        return ()                         # a schema subject: no Kafka resource names it
    principal = USER + rule.principal     # `*` is User:*
    permission = _PERMISSION[rule.permission]
    out: list[Binding] = []
    cluster_ops = KAFKA_OPERATIONS[KafkaResource.CLUSTER].get(rule.operation, ())
    if _covers_cluster(rule):
        out += [Binding(KafkaResource.CLUSTER, CLUSTER_NAME, KafkaPattern.LITERAL, principal, op, permission)
                for op in cluster_ops]
        if rule.pattern_type is PatternType.LITERAL and cluster_ops:
            return tuple(out)             # `literal:__cluster` is the cluster, not a topic
    resource = _RESOURCE[rule.resource]
    if rule.pattern_type is PatternType.PREFIX and not rule.pattern:
        name, pattern = WILDCARD, KafkaPattern.LITERAL
    else:
        name = rule.pattern
        pattern = KafkaPattern.LITERAL if rule.pattern_type is PatternType.LITERAL else KafkaPattern.PREFIXED
    out += [Binding(resource, name, pattern, principal, op, permission)
            for op in KAFKA_OPERATIONS[resource][rule.operation]]
    return tuple(out)


def described(rules: Iterable[AclRule], f: BindingFilter) -> list[Binding]:
    """The bindings of `rules` that `f` matches, each once, in rule order (DescribeAcls)."""
    return list(dict.fromkeys(b for rule in rules for b in bindings_of(rule) if f.matches(b)))


def matching(rules: Iterable[AclRule], f: BindingFilter) -> list[AclRule]:
    """The rules of which `f` matches a binding (DeleteAcls removes them whole: a memq rule is
    the unit memq stores, so removing one of its bindings removes all of them)."""
    return [rule for rule in rules if any(f.matches(b) for b in bindings_of(rule))]
