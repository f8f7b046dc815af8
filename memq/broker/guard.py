"""The broker's gate: who a request is (authentication) and what it may do (ACLs).

Authentication runs as aiohttp middleware on the request line and headers, before any
handler reads a byte of body or upgrades to the produce WebSocket: a request without valid
credentials gets 401 and its connection is closed. The principal is the token's (an
`Authorization: Bearer` header), else the subject CN of a client certificate that
`security.tls_client_ca_file` verified. Health and Prometheus endpoints stay open, for
process managers and scrapers.

Tokens and ACLs are the config file's plus, with ZooKeeper, the cluster's stored ones
(`use_stored`, called by the broker's watch on every change): immutable tuples, each
replaced whole, so a decision never sees half an update.

An open connection is a `Session`: on every change its credentials are checked again, and one
whose token was revoked, or whose principal may no longer produce to a topic it wrote on, is
closed then (not only refused at its next connect): a revoked client keeps no open door.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import Counter

from memq.config import SecurityConfig
from memq.format.metadata import ClusterMetadata, TopicRefusal
from memq.security.acl import Operation, ResourceType, is_allowed, parse_rules
from memq.security.stored import StoredSecurity
from memq.security.tls import subject_cn
from memq.security.tokens import parse_entries, principal_of

OPEN_PATHS = frozenset({"/healthz", "/health", "/metrics"})
PRINCIPAL_KEY = web.RequestKey("memq_principal", str)
_BEARER = "bearer "

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(eq=False)
class Session:
    """An open connection of any door, checked again whenever the tokens or ACLs change.
    `identify()` names the principal its credentials stand for now (None once revoked);
    `close(why)` runs on the connection's event loop; `topics` (replaced whole: read from the
    watch's thread) are those it produced to."""

    identify: Callable[[], str | None]
    principal: str
    close: Callable[[str], None]
    loop: asyncio.AbstractEventLoop
    topics: frozenset[str] = field(default_factory=frozenset)

    def produced(self, topic: str) -> None:
        if topic not in self.topics:
            self.topics = self.topics | {topic}


class Guard:
    """With `security.enabled` off every request passes and `principal_of` is None."""

    def __init__(self, config: SecurityConfig, denials: Counter) -> None:
        self.enabled = config.enabled
        self._configured = (parse_entries(config.tokens), parse_rules(config.acls))
        self._tokens, self._rules = self._configured
        self._denials = denials
        self._sessions: set[Session] = set()
        self._lock = threading.Lock()     # use_stored runs on the ZooKeeper watch's thread

    def use_stored(self, stored: StoredSecurity) -> None:
        """From now on: the config file's tokens and ACLs plus `stored`; open sessions that no
        longer hold are closed."""
        tokens, rules = self._configured
        self._tokens, self._rules = (tokens + parse_entries(stored.tokens), rules + parse_rules(stored.acls))
        with self._lock:
            sessions = list(self._sessions)
        for session in sessions:
            why = self._revoked(session)
            if why is not None:
                self.end_session(session)
                self.count_denial("revoked")
                session.loop.call_soon_threadsafe(session.close, why)

    def open_session(self, request: web.Request, close: Callable[[str], None]) -> Session | None:
        """Track the connection of an authenticated HTTP `request` (None with security off)."""
        principal = request.get(PRINCIPAL_KEY)
        if not self.enabled or principal is None:
            return None
        return self._track(Session(lambda: self._identify(request)[0], principal, close, asyncio.get_running_loop()))

    def open_token_session(self, principal: str, token: str | None, close: Callable[[str], None]) -> Session | None:
        """Track a connection that authenticated with bearer `token` (SASL/PLAIN on the Kafka door),
        or with a client certificate when `token` is None (None with security off)."""
        if not self.enabled:
            return None
        identify: Callable[[], str | None] = (lambda: self.principal_for(token)) if token is not None else \
            (lambda: principal)
        return self._track(Session(identify, principal, close, asyncio.get_running_loop()))

    def _track(self, session: Session) -> Session:
        with self._lock:
            self._sessions.add(session)
        return session

    def end_session(self, session: Session) -> None:
        with self._lock:
            self._sessions.discard(session)

    def _revoked(self, session: Session) -> str | None:
        """Why `session` no longer holds (its credentials, or a right it used, are gone), or None."""
        principal = session.identify()
        if principal != session.principal:
            return f"the credentials of principal {session.principal} were revoked"
        denied = sorted(t for t in session.topics if not self.may(principal, Operation.PRODUCE, t))
        if denied:
            return f"principal {principal} may no longer produce to {', '.join(denied)}"
        return None

    def authenticate(self, request: web.Request) -> str | web.Response:
        """The request's principal, or the 401 response naming what is wrong."""
        principal, why = self._identify(request)
        return principal or self._unauthorized(why)

    def _identify(self, request: web.Request) -> tuple[str | None, str]:
        """The request's principal, else None and why not."""
        header = request.headers.get("Authorization", "")
        if header:
            principal = self.principal_for(header[len(_BEARER):].strip()) \
                if header.lower().startswith(_BEARER) else None
            return principal, "the token is unknown or revoked"
        transport = request.transport
        cn = subject_cn(transport.get_extra_info("peercert")) if transport is not None else None
        return cn, "no credentials: send 'Authorization: Bearer <token>' or a client certificate"

    def principal_for(self, token: str) -> str | None:
        """The principal of bearer `token`, None when it is unknown or revoked."""
        return principal_of(token, self._tokens)

    def count_denial(self, operation: str) -> None:
        self._denials.labels(operation).inc()

    def _unauthorized(self, why: str) -> web.Response:
        """401, and the connection closed after it: nothing more from this client is read."""
        self.count_denial("authenticate")
        response = web.Response(status=401, text=why, headers={"WWW-Authenticate": "Bearer"})
        response.force_close()
        return response

    def may(self, principal: str | None, operation: Operation, topic: str) -> bool:
        """Whether the ACLs let `principal` do `operation` on `topic`."""
        return not self.enabled or (principal is not None and is_allowed(self._rules, principal, operation, topic))

    def may_group(self, principal: str | None, operation: Operation, group: str) -> bool:
        """Whether the ACLs let `principal` do `operation` on the Kafka client group `group`."""
        return not self.enabled or (principal is not None
                                    and is_allowed(self._rules, principal, operation, group, ResourceType.GROUP))

    def may_subject(self, principal: str | None, operation: Operation, subject: str) -> bool:
        """Whether the ACLs let `principal` do `operation` on the schema registry subject `subject`."""
        return not self.enabled or (principal is not None
                                    and is_allowed(self._rules, principal, operation, subject, ResourceType.SUBJECT))

    def allowed(self, principal: str | None, operation: Operation, topic: str) -> bool:
        """`may`, counting a denial: for requests refused, not for topics left out of a listing."""
        ok = self.may(principal, operation, topic)
        if not ok:
            self.count_denial(str(operation))
        return ok

    def allowed_group(self, principal: str | None, operation: Operation, group: str) -> bool:
        """`may_group`, counting a refusal as a `group` denial: every door's check of a group
        (Kafka's consumer and share groups, a transaction's offsets)."""
        ok = self.may_group(principal, operation, group)
        if not ok:
            self.count_denial("group")
        return ok

    def visible(self, principal: str | None, md: ClusterMetadata, requested: Iterable[str]) -> ClusterMetadata:
        """`md` as `principal` may see it: only the topics it may describe, and each topic it asked
        for by name and may not describe in `refused` (Kafka's Metadata answer), whether or not
        the topic exists, so a refusal reveals nothing. Each refusal counts as a denial."""
        if not self.enabled:
            return md
        topics = {name: t for name, t in md.topics.items() if self.may(principal, Operation.DESCRIBE, name)}
        refused = {name: TopicRefusal(principal or "", str(Operation.DESCRIBE)) for name in dict.fromkeys(requested)
                   if not self.allowed(principal, Operation.DESCRIBE, name)}
        return dataclasses.replace(md, topics=topics, refused=refused)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.enabled and request.path not in OPEN_PATHS:
            principal = self.authenticate(request)
            if isinstance(principal, web.Response):
                return principal
            request[PRINCIPAL_KEY] = principal
        return await handler(request)
