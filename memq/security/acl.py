"""Per-topic ACL rules and the decision over them (pure: no I/O).

A rule is one line: `allow|deny PRINCIPAL OPERATION literal:TOPIC|prefix:PREFIX`, e.g.
`allow alice produce prefix:orders.`. `*` as principal means every authenticated principal.
Deny wins over allow; with security on, a request no allow rule matches is denied.
Administering tokens and ACLs needs `admin` on the cluster, the resource `CLUSTER_RESOURCE`
(`literal:__cluster`; `prefix:` covers it too): names starting with `__` are no user topic's.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Iterable

from memq.errors import ConfigError

ANY_PRINCIPAL = "*"
CLUSTER_RESOURCE = "__cluster"


class Operation(StrEnum):
    PRODUCE = "produce"
    CONSUME = "consume"    # read a topic through a broker (the Kafka listener's Fetch, ListOffsets)
    DESCRIBE = "describe"
    ADMIN = "admin"


class PatternType(StrEnum):
    LITERAL = "literal"
    PREFIX = "prefix"


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

    def matches(self, principal: str, operation: Operation, topic: str) -> bool:
        if self.operation is not operation or self.principal not in (principal, ANY_PRINCIPAL):
            return False
        if self.pattern_type is PatternType.LITERAL:
            return topic == self.pattern
        return topic.startswith(self.pattern)

    def __str__(self) -> str:
        return f"{self.permission} {self.principal} {self.operation} {self.pattern_type}:{self.pattern}"


def parse_rule(line: str, where: str = "security.acls") -> AclRule:
    """One rule from its line; ConfigError naming `where` and the line when it is malformed."""
    parts = line.split()
    if len(parts) != 4 or ":" not in parts[3]:
        raise ConfigError(f"{where}: {line!r} is not 'allow|deny PRINCIPAL produce|consume|describe|admin "
                          "literal:TOPIC|prefix:PREFIX'")
    permission, principal, operation, target = parts
    kind, _, pattern = target.partition(":")
    try:
        rule = AclRule(Permission(permission.lower()), principal, Operation(operation.lower()),
                       PatternType(kind.lower()), pattern)
    except ValueError as e:
        raise ConfigError(f"{where}: {line!r}: {e}") from None
    if rule.pattern_type is PatternType.LITERAL and not pattern:
        raise ConfigError(f"{where}: {line!r}: a literal pattern needs a topic name")
    return rule


def parse_rules(lines: Iterable[str], where: str = "security.acls") -> tuple[AclRule, ...]:
    return tuple(parse_rule(line, f"{where}[{i}]") for i, line in enumerate(lines))


def is_allowed(rules: Iterable[AclRule], principal: str, operation: Operation, topic: str) -> bool:
    """Deny wins; without a matching allow rule the answer is no."""
    allowed = False
    for r in rules:
        if r.matches(principal, operation, topic):
            if r.permission is Permission.DENY:
                return False
            allowed = True
    return allowed
