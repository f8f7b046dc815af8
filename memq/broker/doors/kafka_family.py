"""What one family of Kafka APIs declares to the Kafka door, and what it may use of a connection.

The Kafka listener (`doors.kafka`) is a table of families (produce, fetch, groups, share,
admin, ...). A family is one module: the API keys it serves with their version ranges, what
its calls need (the ACL operation, for the docs and the operator), and one `serve` coroutine.
ApiVersions is derived from the table, so it advertises exactly what is served, and adding a
family is one module and one line in the table.

`serve` runs in the connection's read loop, in request order: a family that waits (a long
poll, a relay, ZooKeeper) returns a future and the loop reads on; its answers still go out in
request order. What the admin families share (who asks, the cluster admin, refusals and their
log lines) is `AdminCall`, here, and so is what the two group families note on a connection
(`GroupMembers`); what any two families share of the broker is the core's
(`BrokerCore`), of Kafka's protocol `memq.kafka_api`'s: a family module imports no other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from memq.kafka_api.admin import NO_ZOOKEEPER, Outcome, Refused
from memq.kafka_api.protocol import ErrorCode, Reader, RequestHeader, api_name
from memq.security.acl import Operation

from ..cluster_admin import ClusterAdmin
from ..seam import BrokerCore

if TYPE_CHECKING:
    from memq.audit.emitter import AuditEmitter

    from ..guard import Session

#: What `serve` gives back: the answer (bytes), an answer to come (a future), None for no answer
#: (acks=0 Produce), or why the connection must close (a str, logged).
Response = asyncio.Future[bytes] | bytes | str | None

S = TypeVar("S")

log = logging.getLogger(__name__)


class Conn(Protocol):
    """What a family may use of the connection a request came on."""

    @property
    def core(self) -> BrokerCore: ...

    @property
    def peer(self) -> object: ...

    @property
    def principal(self) -> str | None:
        """Who is asking (None with security off)."""

    @property
    def audit(self) -> AuditEmitter | None: ...

    @property
    def session(self) -> Session | None:
        """The guard's record of this authenticated connection (None with security off)."""

    def state(self, kind: Callable[[Conn], S]) -> S:
        """This connection's state of a family (`kind(conn)` made on first use, then the same; its
        `async closed()`, if it has one, is awaited when the connection ends)."""

    def close(self, why: str) -> None:
        """Close the connection now, `why` in the log (an answer that cannot be given in its API's shape)."""


Serve = Callable[[Conn, RequestHeader, Reader], Awaitable[Response]]


@dataclass(frozen=True)
class Family:
    """One family of Kafka APIs: its keys and versions, what they need, and its handler."""

    name: str
    versions: Mapping[int, tuple[int, int]]   # API key -> (lowest, highest) version served
    needs: str                                # the ACL operation(s) its calls check, as docs say it
    serve: Serve
    before_auth: bool = False                 # served before SASL authentication (SASL itself)



class GroupMembers:
    """The consumer-group members (group, member id) that spoke on one connection, through either
    group family (classic or KIP-848): when it closes, the coordinator cuts their sessions short
    (`GroupCoordinator.disconnected`), so a killed member's partitions move in seconds."""

    def __init__(self, conn: Conn) -> None:
        self._coordinator = conn.core.group_coordinator
        self.members: set[tuple[str, str]] = set()

    async def closed(self) -> None:
        await self._coordinator.disconnected(self.members)


class AdminCall:
    """What the admin families share: who asks, the cluster admin, refusals and their log lines."""

    def __init__(self, conn: Conn, h: RequestHeader) -> None:
        self.h = h
        self.core: BrokerCore = conn.core
        self.principal = conn.principal
        self.peer = conn.peer
        self.cluster = self.core.metadata().cluster

    def authorize(self, operation: Operation, resource: str, error: ErrorCode = ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                  what: str = "topic") -> None:
        """Refused unless the principal may `operation` `resource` (counted as a denial)."""
        if not self.core.guard.allowed(self.principal, operation, resource):
            raise Refused(error, f"principal {self.principal} may not {operation} {what} {resource}")

    def admin(self) -> ClusterAdmin:
        admin = self.core.cluster_admin
        if admin is None:
            raise Refused(ErrorCode.POLICY_VIOLATION, NO_ZOOKEEPER)
        return admin

    def logged(self, name: str | None, outcome: Outcome, validate: bool = False) -> Outcome:
        """`outcome`, logged: a refusal with its code and reason, or what was done."""
        api = f"{api_name(self.h.api_key)} v{self.h.api_version}" + (" (validate only)" if validate else "")
        if outcome.error:
            log.info("Kafka %s of %s by %s (%s): %s: %s", api, name, self.principal, self.peer,
                     outcome.error.name, outcome.message)
        else:
            log.info("Kafka %s of %s by %s (%s): done", api, name, self.principal, self.peer)
        return outcome
