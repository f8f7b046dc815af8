"""Per-topic and per-group ACL rules and the decision over them (pure: no I/O).

A rule is one line: `allow|deny PRINCIPAL OPERATION literal:TOPIC|prefix:PREFIX`, e.g.
`allow alice produce prefix:orders.`. `*` as principal means every authenticated principal.
A Kafka client's consumer group is a resource of its own, named `group:GROUP` or
`group-prefix:PREFIX` (so a topic rule never covers a group of the same name): `consume` on a
group is Kafka's READ (join, sync, heartbeat, leave, commit and fetch its offsets), `describe`
its DESCRIBE (DescribeGroups, ListGroups), `admin` its DELETE (DeleteGroups).
A schema registry subject is a resource too, `subject:SUBJECT` or `subject-prefix:PREFIX`:
`admin` on it registers, deletes and sets its config and mode (reading the registry needs only an
authenticated principal). Kafka's ACL calls neither list nor change subject rules.
Deny wins over allow; with security on, a request no allow rule matches is denied.
As in Kafka, some operations imply others (`IMPLIES`): `produce`, `consume` and `admin` on a
topic imply `describe` on it (Kafka's WRITE, READ, DELETE and ALTER imply DESCRIBE), so a
principal allowed to produce or consume sees the topic it uses. An implied allow never beats a deny: `deny alice describe
literal:t` hides `t` from alice whatever else she may do to it.
Administering tokens and ACLs needs `admin` on the cluster, the resource `CLUSTER_RESOURCE`
(`literal:__cluster`; `prefix:` covers it too): names starting with `__` are no user topic's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from memq.errors import ConfigError

ANY_PRINCIPAL = "*"
CLUSTER_RESOURCE = "__cluster"


class Operation(StrEnum):
    PRODUCE = "produce"
    CONSUME = "consume"    # read a topic through a broker (the Kafka listener's Fetch, ListOffsets)
    DESCRIBE = "describe"
    ADMIN = "admin"


IMPLIES: Mapping[Operation, frozenset[Operation]] = {
    Operation.PRODUCE: frozenset({Operation.DESCRIBE}),
    Operation.CONSUME: frozenset({Operation.DESCRIBE}),
    Operation.ADMIN: frozenset({Operation.DESCRIBE}),
}
"""What an allow of each operation allows besides itself (Kafka: WRITE, READ, DELETE, ALTER -> DESCRIBE)."""


def _granting(operation: Operation) -> frozenset[Operation]:
    """The operations whose allow rules allow `operation`: itself and those that imply it."""
    return frozenset({operation, *(op for op, implied in IMPLIES.items() if operation in implied)})


class PatternType(StrEnum):
    LITERAL = "literal"
    PREFIX = "prefix"


class ResourceType(StrEnum):
    TOPIC = "topic"
    GROUP = "group"    # a Kafka client's consumer group
    SUBJECT = "subject"   # a schema registry subject (memq.schema)


#: A rule's `KIND:` prefix -> (resource, pattern type).
_KINDS: Mapping[str, tuple[ResourceType, PatternType]] = {
    "literal": (ResourceType.TOPIC, PatternType.LITERAL), "prefix": (ResourceType.TOPIC, PatternType.PREFIX),
    "group": (ResourceType.GROUP, PatternType.LITERAL), "group-prefix": (ResourceType.GROUP, PatternType.PREFIX),
    "subject": (ResourceType.SUBJECT, PatternType.LITERAL),
    "subject-prefix": (ResourceType.SUBJECT, PatternType.PREFIX),
}
_KIND_OF = {v: k for k, v in _KINDS.items()}


class Permission(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class AclRule:
    permission: Permission
    principal: str
    operation: Operation
    pattern_type: PatternType
    pattern: str
    resource: ResourceType = ResourceType.TOPIC

    def covers(self, principal: str, name: str, resource: ResourceType = ResourceType.TOPIC) -> bool:
        """Whether this rule is about `principal` and the `resource` `name` (whatever its operation)."""
        if self.principal not in (principal, ANY_PRINCIPAL) or self.resource is not resource:
            return False
        if self.pattern_type is PatternType.LITERAL:
            return name == self.pattern
        return name.startswith(self.pattern)

    def __str__(self) -> str:
        kind = _KIND_OF[(self.resource, self.pattern_type)]
        return f"{self.permission} {self.principal} {self.operation} {kind}:{self.pattern}"


def parse_rule(line: str, where: str = "security.acls") -> AclRule:
    """One rule from its line; ConfigError naming `where` and the line when it is malformed."""
    parts = line.split()
    if len(parts) != 4 or ":" not in parts[3]:
        raise ConfigError(f"{where}: {line!r} is not 'allow|deny PRINCIPAL produce|consume|describe|admin "
                          "literal:TOPIC|prefix:PREFIX|group:GROUP|group-prefix:PREFIX|subject:SUBJECT|"
                          "subject-prefix:PREFIX'")
    permission, principal, operation, target = parts
    kind, _, pattern = target.partition(":")
    if kind.lower() not in _KINDS:
        raise ConfigError(f"{where}: {line!r}: {kind!r} is not one of {', '.join(_KINDS)}")
    resource, pattern_type = _KINDS[kind.lower()]
    try:
        rule = AclRule(Permission(permission.lower()), principal, Operation(operation.lower()), pattern_type,
                       pattern, resource)
    except ValueError as e:
        raise ConfigError(f"{where}: {line!r}: {e}") from None
    if rule.pattern_type is PatternType.LITERAL and not pattern:
        raise ConfigError(f"{where}: {line!r}: a literal pattern needs a {resource} name")
    return rule


def parse_rules(lines: Iterable[str], where: str = "security.acls") -> tuple[AclRule, ...]:
    return tuple(parse_rule(line, f"{where}[{i}]") for i, line in enumerate(lines))


def is_allowed(rules: Iterable[AclRule], principal: str, operation: Operation, name: str,
               resource: ResourceType = ResourceType.TOPIC) -> bool:
    """Deny wins; without a matching allow rule the answer is no. An allow of `operation` or of
    an operation implying it allows it; a deny denies only the operation it names (Kafka's rule)."""
    allowing = _granting(operation)
    allowed = False
    for r in rules:
        if not r.covers(principal, name, resource):
            continue
        if r.permission is Permission.DENY:
            if r.operation is operation:
                return False
        elif r.operation in allowing:
            allowed = True
    return allowed
