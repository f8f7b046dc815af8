"""What one family of Kafka APIs declares to the Kafka door, and what it may use of a connection.

The Kafka listener (`doors.kafka`) is a table of families (produce, fetch, groups, share,
admin, ...). A family is one module: the API keys it serves with their version ranges, what
its calls need (the ACL operation, for the docs and the operator), and one `serve` coroutine.
ApiVersions is derived from the table, so it advertises exactly what is served, and adding a
family is one module and one line in the table.

`serve` runs in the connection's read loop, in request order: a family that waits (a long
poll, a relay, ZooKeeper) returns a future and the loop reads on; its answers still go out in
request order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from memq.kafka_api.protocol import RequestHeader, Reader

from ..seam import BrokerCore

if TYPE_CHECKING:
    from memq.audit.emitter import AuditEmitter

    from ..guard import Session

#: What `serve` gives back: the answer (bytes), an answer to come (a future), None for no answer
#: (acks=0 Produce), or why the connection must close (a str, logged).
Response = asyncio.Future[bytes] | bytes | str | None

S = TypeVar("S")


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
        """This connection's state of a family (`kind(conn)` made on first use, then the same)."""

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

