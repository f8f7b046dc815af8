"""The broker's Kafka door: an asyncio shell over the sans-I/O codec of `memq.kafka_api`, one
task per client connection, dispatching by a table of API families (`FAMILIES`).

Each family is one module (`kafka_produce`, `kafka_fetch`, `kafka_cluster`, `kafka_groups`,
`kafka_share`, `kafka_share_admin`, `kafka_txn`, `kafka_admin_*`, and SASL here) declaring its API
keys, their versions, the ACL operation its calls need and one `serve` coroutine
(`kafka_family.Family`); no family imports another. ApiVersions is derived from the table
(`SERVED`): it advertises exactly what is served.

Requests are read and handled one at a time, in order (so a full batch ring stops the
reading and TCP pushes back, as on `/v1/produce`); responses are futures queued in request
order and written by one writer task, so acks=all Produce requests pipeline like on a Kafka
broker (librdkafka keeps up to 5 in flight). A frame that cannot be parsed, is larger
than `broker.max_frame_bytes`, or names an API or version not served (other than ApiVersions,
which answers UNSUPPORTED_VERSION with our ranges) closes the connection with the reason in
the log, as a Kafka broker does: its response shape is unknown, so no answer could be parsed
by the client.

With `security.enabled` the listener is behind the broker's Guard: TLS when the broker has a
certificate; a connection's principal is its client certificate's CN or comes from SASL/PLAIN
(password = a memq token, username = its principal). Until then only ApiVersions, SaslHandshake
and SaslAuthenticate are served, in frames of at most `PRE_AUTH_MAX_FRAME` bytes; anything else
closes the connection.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from memq.errors import ProtocolError
from memq.format.wire import AckCode
from memq.kafka_api.protocol import (ApiKey, ErrorCode, Reader, RequestHeader, api_name, decode_request_header,
                                     decode_sasl_authenticate, decode_sasl_handshake, encode_api_versions,
                                     encode_sasl_authenticate, encode_sasl_handshake, parse_sasl_plain)
from memq.security.tls import subject_cn

from ..guard import Session
from ..seam import BrokerCore
from . import (kafka_cluster, kafka_consumer_groups, kafka_fetch, kafka_groups, kafka_produce, kafka_share,
               kafka_share_admin)
from . import kafka_admin_records
from . import kafka_txn
from . import kafka_admin_acls
from . import kafka_admin_configs, kafka_admin_topics
from .kafka_family import Conn, Family, Response
from .kafka_produce import MAX_ACK_WAIT_S, ProduceState

if TYPE_CHECKING:
    from memq.audit.emitter import AuditEmitter

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
#: Requests read ahead of their responses per connection (librdkafka sends at most 5 Produce).
MAX_IN_FLIGHT = 32
FRAME_READ_TIMEOUT_S = 30.0    # a frame whose size arrived must follow within this
WRITE_TIMEOUT_S = 30.0         # a client that does not read its responses this long is closed
#: Bytes a connection's reader buffers before it stops reading the socket. asyncio's 64 KiB
#: default paused and resumed the socket (two epoll changes) on every read of a producer's
#: ~1 MB requests: ~17% of the broker's profile samples under a bulk Kafka producer.
READ_BUFFER_BYTES = 1024 * 1024
PRE_AUTH_MAX_FRAME = 64 * 1024   # before authentication: SASL messages are small
SASL_MECHANISMS = ("PLAIN",)

S = TypeVar("S")


class KafkaListener:
    """Serves Kafka producers for one Broker on its own port."""

    def __init__(self, broker: BrokerCore, audit: AuditEmitter | None = None) -> None:
        self._broker = broker
        self._audit = audit
        self._server: asyncio.Server | None = None
        self._connections: dict[KafkaConnection, asyncio.Task[None]] = {}
        self.address = ""

    async def start(self, host: str, port: int, advertised_host: str = "", tls: ssl.SSLContext | None = None) -> str:
        """Listen (port 0: any free one; TLS with `tls`); returns the advertised "host:port"."""
        self._server = await asyncio.start_server(self._accept, host, port, ssl=tls, limit=READ_BUFFER_BYTES)
        bound = self._server.sockets[0].getsockname()[1]
        self.address = f"{advertised_host or host}:{bound}"
        log.info("broker %s: Kafka listener on %s", self._broker.broker_id, self.address)
        return self.address

    async def stop(self) -> None:
        """Stop accepting, then close every connection (called after the topics are drained)."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.close()   # its reader sees EOF; responses still due are written or dropped
        if self._connections:
            await asyncio.wait(list(self._connections.values()), timeout=WRITE_TIMEOUT_S)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        conn = KafkaConnection(self._broker, reader, writer, self._audit)
        self._connections[conn] = task
        try:
            await conn.run()
        finally:
            self._connections.pop(conn, None)


class KafkaConnection:
    """One client connection: reads requests in order, serves each through its family, writes
    the answers in request order."""

    def __init__(self, broker: BrokerCore, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 audit: AuditEmitter | None = None) -> None:
        self._broker = broker
        self._audit = audit
        self._reader = reader
        self._writer = writer
        self._peer = writer.get_extra_info("peername")
        self._responses: asyncio.Queue[asyncio.Future[bytes] | None] = asyncio.Queue(MAX_IN_FLIGHT)
        self._metrics = broker.metrics
        self._states: dict[Callable[[Any], Any], Any] = {}   # each family's state on this connection
        self._guard = broker.guard
        # With security on: who this is (a verified client certificate's CN, or SASL below).
        self._principal = subject_cn(writer.get_extra_info("peercert")) if broker.guard.enabled else None
        self._authenticated = not broker.guard.enabled or self._principal is not None
        self._close_after: str = ""    # set when a response must be the last one (failed SASL)
        # the guard's record of this connection once authenticated: closed if its token is revoked
        # or its principal loses produce on a topic it wrote to
        self._session: Session | None = None
        if self._authenticated and self._principal is not None:
            self._session = self._guard.open_token_session(self._principal, None, self._revoke)

    # --- what a family may use (kafka_family.Conn) ------------------------------------------

    @property
    def core(self) -> BrokerCore:
        return self._broker

    @property
    def peer(self) -> object:
        return self._peer

    @property
    def principal(self) -> str | None:
        return self._principal

    @property
    def audit(self) -> AuditEmitter | None:
        return self._audit

    @property
    def session(self) -> Session | None:
        return self._session

    def state(self, kind: Callable[[Conn], S]) -> S:
        st = self._states.get(kind)
        if st is None:
            st = self._states[kind] = kind(self)
        return st  # type: ignore[no-any-return]

    def close(self, why: str = "") -> None:
        if why:
            log.warning("closing Kafka connection from %s: %s", self._peer, why)
        self._writer.close()

    def _revoke(self, why: str) -> None:
        """Its credentials or rights no longer hold (the guard's session check): close at once."""
        self.close(f"principal {self._principal}: {why}")

    async def run(self) -> None:
        writer_task = asyncio.create_task(self._write_responses(), name="kafka-responses")
        self._metrics.connections.inc()
        try:
            why = await self._read_requests()
            if why:
                log.warning("closing Kafka connection from %s: %s", self._peer, why)
        finally:
            self._metrics.connections.dec()
            if self._session is not None:
                self._guard.end_session(self._session)
            for st in list(self._states.values()):   # a family's state may act on the close (Conn.state)
                closed = getattr(st, "closed", None)
                if closed is not None:
                    try:
                        await closed()
                    except Exception:
                        log.exception("Kafka connection from %s: a family's close failed", self._peer)
            try:   # let the responses already due go out (each bounded by its request's timeout)
                async with asyncio.timeout(WRITE_TIMEOUT_S + MAX_ACK_WAIT_S):
                    if not writer_task.done():
                        await self._responses.put(None)
                    await writer_task
            except (TimeoutError, asyncio.CancelledError):
                writer_task.cancel()
            self._writer.close()

    async def _read_requests(self) -> str:
        """Handle requests until EOF (""), or return why the connection must close."""
        while True:
            limit = self._broker.config.broker.max_frame_bytes if self._authenticated else PRE_AUTH_MAX_FRAME
            try:
                head = await self._read_head()
            except (asyncio.IncompleteReadError, ConnectionError):
                return ""
            (size,) = _SIZE.unpack(head)
            if not 0 < size <= limit:
                return f"request of {size} bytes (broker.max_frame_bytes={limit})"
            try:
                async with asyncio.timeout(FRAME_READ_TIMEOUT_S):   # no task per read, unlike wait_for
                    frame = await self._reader.readexactly(size)
            except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
                return f"request of {size} bytes not received in full"
            try:
                h, body = decode_request_header(frame)
                response = await self._dispatch(h, body)
            except ProtocolError as e:
                self._metrics.rejected.labels(AckCode.PROTOCOL).inc()
                return f"malformed request: {e}"
            if isinstance(response, str):
                self._metrics.rejected.labels(AckCode.PROTOCOL).inc()
                return response
            if isinstance(response, bytes):
                response = _ready(response)
            if response is not None:
                await self._responses.put(response)
            produce = self._states.get(ProduceState)
            if produce is not None and produce.throttle_s:
                await asyncio.sleep(produce.throttle_s)
                produce.throttle_s = 0.0
            if self._close_after:
                return self._close_after

    async def _read_head(self) -> bytes:
        """The next frame's size. Quiet for `kafka_idle_seal_ms` with acks=all Messages appended,
        the client is waiting on them: seal their topics' batches (`ProduceState.idle_seal`)
        rather than make it wait for `batch_ms`. A timed-out read consumes nothing."""
        bc = self._broker.config.broker
        produce = self._states.get(ProduceState)
        if produce is not None and produce.awaiting and bc.kafka_idle_seal_ms:
            try:
                async with asyncio.timeout(bc.kafka_idle_seal_ms / 1000):
                    return await self._reader.readexactly(4)
            except TimeoutError:
                produce.idle_seal()
        return await self._reader.readexactly(4)

    async def _dispatch(self, h: RequestHeader, body: Reader) -> Response:
        """The response to come, None for none (acks=0), or why the connection must close."""
        if h.api_key == ApiKey.API_VERSIONS:
            error = ErrorCode.NONE if _served(h) else ErrorCode.UNSUPPORTED_VERSION
            return encode_api_versions(h, SERVED, error)
        family = ROUTES.get(h.api_key)
        if family is None or not _served(h):
            return (f"{api_name(h.api_key)} version {h.api_version} is not served "
                    f"(client {h.client_id!r}; see ApiVersions)")
        if not self._authenticated and not family.before_auth:
            self._guard.count_denial("authenticate")
            return (f"{api_name(h.api_key)} before authentication (client {h.client_id!r}): use SASL/PLAIN "
                    "with a memq token as password, or a client certificate")
        return await family.serve(self, h, body)

    # --- SASL (the connection's own family: it sets who the connection is) -------------------

    def sasl_handshake(self, h: RequestHeader, body: Reader) -> bytes:
        mechanism = decode_sasl_handshake(body)
        if not self._guard.enabled:
            return encode_sasl_handshake(h, ErrorCode.ILLEGAL_SASL_STATE, ())
        ok = mechanism in SASL_MECHANISMS
        return encode_sasl_handshake(h, ErrorCode.NONE if ok else ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                                     SASL_MECHANISMS)

    def sasl_authenticate(self, h: RequestHeader, body: Reader) -> bytes:
        """SASL/PLAIN: the password is a memq token, the username must be its principal. A failure
        is answered, then the connection closes."""
        if not self._guard.enabled or self._authenticated:
            self._close_after = "SaslAuthenticate on a connection that needs none (security off or done)"
            return encode_sasl_authenticate(h, ErrorCode.ILLEGAL_SASL_STATE, self._close_after)
        username, token = parse_sasl_plain(decode_sasl_authenticate(body))
        principal = self._guard.principal_for(token)
        if principal is None or principal != username:
            self._guard.count_denial("authenticate")
            self._close_after = (f"SASL/PLAIN authentication of {username!r} failed: the password must be a "
                                 "valid memq token of that principal (unknown, revoked or another's)")
            return encode_sasl_authenticate(h, ErrorCode.SASL_AUTHENTICATION_FAILED, self._close_after)
        self._principal, self._authenticated = principal, True
        self._session = self._guard.open_token_session(principal, token, self._revoke)
        return encode_sasl_authenticate(h, ErrorCode.NONE, None)

    async def _write_responses(self) -> None:
        while True:
            pending = await self._responses.get()
            if pending is None:
                return
            try:
                data = await pending
            except Exception:   # a bug in building a response: say so and close, never hang the client
                log.exception("Kafka connection from %s: building a response failed; closing", self._peer)
                self._writer.close()
                return
            try:
                self._writer.write(data)
                async with asyncio.timeout(WRITE_TIMEOUT_S):
                    await self._writer.drain()
            except (ConnectionError, TimeoutError) as e:
                log.warning("Kafka connection from %s: response not written (%s)", self._peer, e)
                self._writer.close()
                return


async def _sasl(conn: Conn, h: RequestHeader, body: Reader) -> Response:
    assert isinstance(conn, KafkaConnection)
    if h.api_key == ApiKey.SASL_HANDSHAKE:
        return conn.sasl_handshake(h, body)
    return conn.sasl_authenticate(h, body)


#: The Kafka door: every family of APIs it serves. A new family is one module and one line here.
FAMILIES: tuple[Family, ...] = (
    # v1: the SASL exchange goes in SaslAuthenticate requests (KIP-152)
    Family("sasl", {ApiKey.SASL_HANDSHAKE: (0, 1), ApiKey.SASL_AUTHENTICATE: (0, 1)}, "none", _sasl,
           before_auth=True),
    kafka_cluster.FAMILY,
    kafka_produce.FAMILY,
    kafka_fetch.FAMILY,
    kafka_groups.FAMILY,
    kafka_consumer_groups.FAMILY,
    kafka_share.FAMILY,
    kafka_share_admin.FAMILY,
    # admin families (one line each)
    kafka_txn.FAMILY,
    kafka_admin_topics.FAMILY,
    kafka_admin_configs.FAMILY,
    kafka_admin_acls.FAMILY,
    kafka_admin_records.FAMILY,
)


def _routes(families: tuple[Family, ...]) -> dict[int, Family]:
    out: dict[int, Family] = {}
    for f in families:
        for key in f.versions:
            if key in out or key == ApiKey.API_VERSIONS:
                raise ValueError(f"API key {key} served by both {out[key].name if key in out else 'the door'} "
                                 f"and {f.name}")
            out[key] = f
    return out


ROUTES: Mapping[int, Family] = _routes(FAMILIES)
#: What ApiVersions advertises: exactly what the families serve, and ApiVersions itself.
SERVED: Mapping[int, tuple[int, int]] = {ApiKey.API_VERSIONS: (0, 2)} | {
    key: v for f in FAMILIES for key, v in f.versions.items()}


def _served(h: RequestHeader) -> bool:
    lo, hi = SERVED.get(h.api_key, (0, -1))
    return lo <= h.api_version <= hi


def _ready(data: bytes) -> asyncio.Future[bytes]:
    f: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    f.set_result(data)
    return f
