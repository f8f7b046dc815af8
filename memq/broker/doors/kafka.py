"""The broker's Kafka door: an asyncio shell over the sans-I/O codec of `memq.kafka_api`, one
task per client connection. Produce is here; Fetch and ListOffsets in `kafka_fetch`.

Requests are read and handled one at a time, in order (so a full batch ring stops the
reading and TCP pushes back, as on `/v1/produce`); responses are futures queued in request
order and written by one writer task, so acks=all Produce requests pipeline like on a Kafka
broker (librdkafka keeps up to 5 in flight). Each RecordBatch of a Produce request has its
header and CRC32C checked and goes, unchanged, as one Codec.KAFKA Message through the broker's
one admission path (`memq.broker.admission`, the same checks as `/v1/produce`): the same batching, storage, notification and dedup as memq's own
protocol. A Kafka client has no memq audit emitter, so the listener reports each acked Message
(acks 1 and all) to the audit as its producer would, and what each OffsetCommit of a Kafka
group covers as that group's consumption (`memq.broker.group_audit`). A frame that cannot be parsed, is larger
than `broker.max_frame_bytes`, or names an API or version not served (other than ApiVersions,
which answers UNSUPPORTED_VERSION with our ranges) closes the connection with the reason in the log, as a Kafka broker does: its
response shape is unknown, so no answer could be parsed by the client.

With `security.enabled` the listener is behind the broker's Guard: TLS when the broker has a
certificate; a connection's principal is its client certificate's CN or comes from SASL/PLAIN
(password = a memq token, username = its principal). Until then only ApiVersions, SaslHandshake
and SaslAuthenticate are served, in frames of at most `PRE_AUTH_MAX_FRAME` bytes; anything else
closes the connection. Produce needs `produce` on the topic (TOPIC_AUTHORIZATION_FAILED naming
principal and topic, nothing appended), Metadata lists only topics the principal may describe
and answers a requested one it may not describe TOPIC_AUTHORIZATION_FAILED, existing or not.
Produce quotas hold here as on `/v1/produce` (memq.security.quota; the principal is the
connection's, "anonymous" with security off): a Produce over quota is accepted, its response
carries `throttle_time_ms`, and the connection is not read for that long (KIP-219).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import ssl
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

from memq.errors import FormatError, NotifyError, ProtocolError, UnsupportedCodecError, UnsupportedVersionError
from memq.format.kafka_records import split_kafka_batches, verify_kafka_batch
from memq.format.message import MESSAGE_HEADER_SIZE, MessageHeader, encode_kafka_message
from memq.format.wire import Ack, AckCode, AckLevel
from memq.security.acl import Operation
from memq.security.tls import subject_cn

from ..admission import Refusal, Ticket
from ..guard import Session
from ..group_audit import GroupAudit
from ..groups import GroupLink
from ..seam import BrokerCore

from memq.kafka_api.groups import (RELAYED, Described, commit_errors, committed_offsets, decode_delete_groups,
                                  decode_find_coordinator, decode_offset_fetch_v1, delete_group_request,
                                  delete_group_result, describe_groups_of, describe_groups_request,
                                  describe_groups_response, encode_delete_groups, encode_find_coordinator, group_of,
                                  list_groups_filters, list_groups_flex_response, list_groups_response,
                                  offset_fetch_request, offsets_request, offsets_response, refusal, with_described,
                                  with_size)
from memq.kafka_api.idle_seal import SealCredit
from memq.kafka_api.offsets import produce_base_offset
from memq.kafka_api.mapping import (PRODUCER_ID_BITS, ack_level, error_code, memq_producer_id, metadata_view, node_id,
                                   split_address)
from memq.kafka_api.protocol import (ApiKey, ErrorCode, FetchRequest, ListOffsetsRequest, PartitionData, PartitionResult, ProduceRequest, ProduceResult, Reader, Writer,
                       RequestHeader, api_name, decode_fetch, decode_init_producer_id,
                       decode_list_offsets, decode_metadata, decode_produce, decode_request_header,
                       decode_sasl_authenticate, decode_sasl_handshake, encode_api_versions, encode_fetch,
                       encode_init_producer_id, encode_list_offsets, encode_metadata, encode_produce,
                       encode_sasl_authenticate, encode_sasl_handshake, is_supported, parse_sasl_plain)

from memq.kafka_api.flexible import flex_body

from . import kafka_fetch, kafka_share, kafka_share_admin

if TYPE_CHECKING:
    from memq.audit.emitter import AuditEmitter

log = logging.getLogger(__name__)

#: One appended RecordBatch: its ack to come and its record count.
Appended = tuple[asyncio.Future[Ack], int]

_SIZE = struct.Struct(">i")
#: Requests read ahead of their responses per connection (librdkafka sends at most 5 Produce).
MAX_IN_FLIGHT = 32
FRAME_READ_TIMEOUT_S = 30.0    # a frame whose size arrived must follow within this
WRITE_TIMEOUT_S = 30.0         # a client that does not read its responses this long is closed
#: An acks=all Produce waits for its acks the request's timeout_ms, within these bounds, then
#: answers REQUEST_TIMED_OUT for what is still pending (it may still be stored: the client retries
#: with the same ids, so an idempotent producer's retry is dropped as a duplicate).
MIN_ACK_WAIT_S = 1.0
MAX_ACK_WAIT_S = 300.0
#: A connection banks idle-seal credit (`idle_seal`) up to this many `broker.kafka_idle_seal_bytes`.
IDLE_SEAL_BANK = 4
#: Bytes a connection's reader buffers before it stops reading the socket. asyncio's 64 KiB
#: default paused and resumed the socket (two epoll changes) on every read of a producer's
#: ~1 MB requests: ~17% of the broker's profile samples under a bulk Kafka producer.
READ_BUFFER_BYTES = 1024 * 1024
PRE_AUTH_MAX_FRAME = 64 * 1024   # before authentication: SASL messages are small
SASL_MECHANISMS = ("PLAIN",)
_PRE_AUTH_APIS = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})


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
    def __init__(self, broker: BrokerCore, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 audit: AuditEmitter | None = None) -> None:
        self._broker = broker
        self._audit = audit
        self._reader = reader
        self._writer = writer
        self._peer = writer.get_extra_info("peername")
        self._responses: asyncio.Queue[asyncio.Future[bytes] | None] = asyncio.Queue(MAX_IN_FLIGHT)
        self._request_ids = itertools.count()
        # A producer without idempotence: its Messages get this id and a per-connection
        # sequence, unique so nothing is dropped as a duplicate (Kafka does not dedup them either).
        self._producer_id = secrets.randbits(64)
        self._sequence = itertools.count()
        self._metrics = broker.metrics
        self._throttle_s = 0.0   # owed by the request just handled: read nothing more for this long
        # topics with acks=all Messages appended since the last idle seal
        self._awaiting: dict[str, Ticket] = {}
        seal_unit = broker.config.broker.kafka_idle_seal_bytes
        self._seal_credit = SealCredit(seal_unit, IDLE_SEAL_BANK * seal_unit)
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
        self._groups: GroupLink | None = None   # this connection's relay to group coordinators
        # Kafka groups' commits counted by the audit: (group, topic, partition) -> last commit
        self._group_audit = GroupAudit(broker.reads, audit) if audit is not None else None
        self._committed: dict[tuple[str, str, int], int] = {}
        self._auditing: set[asyncio.Future[int]] = set()

    def close(self) -> None:
        self._writer.close()

    def _revoke(self, why: str) -> None:
        """Its credentials or rights no longer hold (the guard's session check): close at once."""
        log.warning("closing Kafka connection from %s (principal %s): %s", self._peer, self._principal, why)
        self._writer.close()

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
            if self._groups is not None:
                self._groups.close()
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
            if response is not None:
                await self._responses.put(response)
            if self._throttle_s:
                await asyncio.sleep(self._throttle_s)
                self._throttle_s = 0.0
            if self._close_after:
                return self._close_after

    async def _read_head(self) -> bytes:
        """The next frame's size. Quiet for `kafka_idle_seal_ms` with acks=all Messages appended,
        the client is waiting on them: seal their topics' batches (`_idle_seal`) rather than make
        it wait for `batch_ms`. A timed-out read consumes nothing."""
        bc = self._broker.config.broker
        if self._awaiting and bc.kafka_idle_seal_ms:
            try:
                async with asyncio.timeout(bc.kafka_idle_seal_ms / 1000):
                    return await self._reader.readexactly(4)
            except TimeoutError:
                self._idle_seal()
        return await self._reader.readexactly(4)

    def _idle_seal(self) -> None:
        """Seal the awaited topics' batches the connection's credit allows (`idle_seal`)."""
        for ticket in self._awaiting.values():
            if ticket.seal_if_at_least(self._seal_credit.threshold()):
                self._seal_credit.spend()
        self._awaiting.clear()

    async def _dispatch(self, h: RequestHeader, body: Reader) -> asyncio.Future[bytes] | str | None:
        """The response to come, None for none (acks=0), or why the connection must close."""
        if h.api_key == ApiKey.API_VERSIONS:
            error = ErrorCode.NONE if is_supported(h) else ErrorCode.UNSUPPORTED_VERSION
            return _ready(encode_api_versions(h, error))
        if not is_supported(h):
            return (f"{api_name(h.api_key)} version {h.api_version} is not served "
                    f"(client {h.client_id!r}; see ApiVersions)")
        if h.api_key == ApiKey.SASL_HANDSHAKE:
            return _ready(self._sasl_handshake(h, body))
        if h.api_key == ApiKey.SASL_AUTHENTICATE:
            return _ready(self._sasl_authenticate(h, body))
        if not self._authenticated and h.api_key not in _PRE_AUTH_APIS:
            self._guard.count_denial("authenticate")
            return (f"{api_name(h.api_key)} before authentication (client {h.client_id!r}): use SASL/PLAIN "
                    "with a memq token as password, or a client certificate")
        if h.api_key == ApiKey.METADATA:
            if h.api_version >= 9:   # flexible, with topic ids (share consumers)
                return _ready(kafka_share.metadata(self._broker, self._principal, h, flex_body(body)))
            return _ready(self._metadata(h, body))
        if h.api_key in kafka_share.APIS:
            return asyncio.ensure_future(
                kafka_share.ShareDoor(self._broker, self._peer, self._principal).serve(h, flex_body(body)))
        if h.api_key in kafka_share_admin.APIS:
            return asyncio.ensure_future(
                kafka_share_admin.ShareAdminDoor(self._broker, self._peer, self._principal).serve(h, flex_body(body)))
        if h.api_key == ApiKey.INIT_PRODUCER_ID:
            return _ready(self._init_producer_id(h, body))
        if h.api_key == ApiKey.FETCH:   # answered in turn, read on meanwhile: a long poll blocks no other request
            return asyncio.ensure_future(self._fetch(h, decode_fetch(h, body)))
        if h.api_key == ApiKey.LIST_OFFSETS:
            return asyncio.ensure_future(self._list_offsets(h, decode_list_offsets(h, body)))
        if h.api_key == ApiKey.FIND_COORDINATOR:
            return _ready(self._find_coordinator(h, body))
        if h.api_key == ApiKey.DELETE_GROUPS:
            return asyncio.ensure_future(self._delete_groups(h, body.buf, body.pos, decode_delete_groups(body)))
        if h.api_key in (ApiKey.DESCRIBE_GROUPS, ApiKey.LIST_GROUPS):   # admin tools: this cluster's groups
            cluster = self._broker.groups.cluster
            local: list[Described] = []   # answered here: refused, or share groups (kept by memq)
            filters: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
            if h.api_key == ApiKey.LIST_GROUPS:
                if h.api_version >= 3:
                    filters = list_groups_filters(h, flex_body(body))
                else:
                    body.done()
                request = with_size(body.buf)
            else:
                asked = describe_groups_of(body)
                allowed = [g for g in asked if self._may_group(Operation.DESCRIBE, g)]
                shared = kafka_share.described_groups(self._broker)
                local = [Described(g, ErrorCode.GROUP_AUTHORIZATION_FAILED) for g in asked if g not in allowed]
                local += [shared[g] for g in allowed if g in shared]
                relayed = [g for g in allowed if g not in shared]
                if not relayed:
                    return _ready(with_described(h, _no_groups(h), local))
                request = describe_groups_request(h, body.buf, body.pos, cluster, relayed)
            return asyncio.ensure_future(self._relay(h, self._broker.groups.mapped(""), request, {}, local, filters))
        if h.api_key in RELAYED:
            asked_group = group_of(body)
            if not self._may_group(_GROUP_OPERATION[ApiKey(h.api_key)], asked_group):
                return _ready(refusal(h, body.buf, body.pos, ErrorCode.GROUP_AUTHORIZATION_FAILED))
            if h.api_key == ApiKey.JOIN_GROUP:   # a rebalance: another member may commit these partitions now
                self._committed = {k: v for k, v in self._committed.items() if k[0] != asked_group}
            group = self._broker.groups.mapped(asked_group)
            names = {n: t.notification_topic for n, t in self._broker.metadata().topics.items()}
            request = offsets_request(h, body.buf, body.pos, group, names)
            back = {v: k for k, v in names.items()}
            if h.api_key == ApiKey.OFFSET_COMMIT and self._group_audit is not None:
                commits = [(t, p, o) for t, p, o in committed_offsets(h, body.buf, body.pos) if t in names]
                return asyncio.ensure_future(self._audited_commit(h, asked_group, request, names, commits))
            return asyncio.ensure_future(self._relay(h, group, request, back))
        req = decode_produce(body)
        return await self._produce(h, req)

    def _sasl_handshake(self, h: RequestHeader, body: Reader) -> bytes:
        mechanism = decode_sasl_handshake(body)
        if not self._guard.enabled:
            return encode_sasl_handshake(h, ErrorCode.ILLEGAL_SASL_STATE, ())
        ok = mechanism in SASL_MECHANISMS
        return encode_sasl_handshake(h, ErrorCode.NONE if ok else ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                                     SASL_MECHANISMS)

    def _sasl_authenticate(self, h: RequestHeader, body: Reader) -> bytes:
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

    def _metadata(self, h: RequestHeader, body: Reader) -> bytes:
        req = decode_metadata(h, body)
        meta = self._guard.visible(self._principal, self._broker.metadata(), req.topics or ())
        nodes, topics = metadata_view(meta, req.topics)
        return encode_metadata(h, nodes, meta.cluster, node_id(self._broker.broker_id), topics)

    def _init_producer_id(self, h: RequestHeader, body: Reader) -> bytes:
        transactional_id = decode_init_producer_id(body)
        if transactional_id is not None:
            log.info("refused InitProducerId for transactional id %r from %s: memq has no Kafka transactions",
                     transactional_id, self._peer)
            return encode_init_producer_id(h, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1)
        # Random, so brokers hand out ids without coordinating (see mapping.PRODUCER_ID_BITS).
        return encode_init_producer_id(h, ErrorCode.NONE, secrets.randbits(PRODUCER_ID_BITS), 0)

    # --- Fetch, ListOffsets (doors.kafka_fetch) ---------------------------------------------

    async def _fetch(self, h: RequestHeader, req: FetchRequest) -> bytes:
        return encode_fetch(h, await kafka_fetch.fetch(self._broker, self._principal, req, self._peer))

    async def _list_offsets(self, h: RequestHeader, req: ListOffsetsRequest) -> bytes:
        return encode_list_offsets(h, await kafka_fetch.list_offsets(self._broker, self._principal, req))

    # --- groups (kafka_api.groups): kept by the notification Kafka's coordinator ----------------

    def _find_coordinator(self, h: RequestHeader, body: Reader) -> bytes:
        """Any broker coordinates any group: it relays to the notification Kafka's coordinator."""
        key, key_type = decode_find_coordinator(h, body)
        if key_type == 0 and not self._may_group(Operation.DESCRIBE, key):   # as Kafka: DESCRIBE on the group
            return encode_find_coordinator(h, ErrorCode.GROUP_AUTHORIZATION_FAILED, -1, "", -1,
                                           f"principal {self._principal} may not describe group {key!r}")
        meta = self._broker.metadata()   # a share group needs one coordinator: a hash picks it
        me = [b for b in meta.brokers if b.id == kafka_share.coordinator_of(meta, key) and b.kafka_address]
        if key_type != 0 or not me:
            return encode_find_coordinator(h, ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, "", -1,
                                           "memq coordinates consumer groups only, on brokers with a Kafka listener")
        host, port = split_address(me[0].kafka_address)
        return encode_find_coordinator(h, ErrorCode.NONE, node_id(me[0].id), host, port)

    def _may_group(self, operation: Operation, group: str) -> bool:
        """Whether this connection's principal may do `operation` on Kafka client group `group`
        (a refusal counted as a `group` denial)."""
        ok = self._guard.may_group(self._principal, operation, group)
        if not ok:
            self._guard.count_denial("group")
        return ok

    def _link(self) -> GroupLink:
        if self._groups is None:
            self._groups = self._broker.groups.link()
        return self._groups

    async def _audited_commit(self, h: RequestHeader, asked_group: str, request: bytes, names: dict[str, str],
                              commits: list[tuple[str, int, int]]) -> bytes:
        """Relay an OffsetCommit, then report to the audit what each committed partition's
        group consumed since its previous commit (`group_audit`), asked of the coordinator
        once per partition and connection, before the commit moves it."""
        group = self._broker.groups.mapped(asked_group)
        unknown: dict[str, list[int]] = {}
        for t, p, _ in commits:
            if (asked_group, t, p) not in self._committed:
                unknown.setdefault(names[t], []).append(p)
        before: dict[tuple[str, int], int] = {}
        if unknown:
            try:
                fetched = await self._link().relay(group, offset_fetch_request(0, "memq-audit", group, unknown))
                back = {v: k for k, v in names.items()}
                before = {(back[t], p): o for (t, p), o in decode_offset_fetch_v1(fetched).items() if t in back}
            except (NotifyError, ProtocolError) as e:   # the commit goes on; only its audit is lost
                log.warning("Kafka group %r: previous commits not read for the audit: %s", asked_group, e)
                commits = [c for c in commits if (asked_group, c[0], c[1]) in self._committed]
        response = await self._relay(h, group, request, {v: k for k, v in names.items()})
        if not response:
            return response
        errors = commit_errors(h, response)
        audit = self._group_audit
        assert audit is not None
        for t, p, offset in commits:
            if errors.get((t, p)) != ErrorCode.NONE:
                continue
            prev = self._committed.get((asked_group, t, p), before.get((t, p), -1))
            self._committed[(asked_group, t, p)] = offset
            task = asyncio.ensure_future(audit.committed(asked_group, t, names[t], p, prev, offset))
            self._auditing.add(task)
            task.add_done_callback(self._auditing.discard)
        return response

    async def _relay(self, h: RequestHeader, group: str, request: bytes, names: dict[str, str],
                     local: Sequence[Described] = (),
                     filters: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())) -> bytes:
        try:
            response = await self._link().relay(group, request)
            cluster = self._broker.groups.cluster
            if h.api_key == ApiKey.LIST_GROUPS:   # as Kafka lists them: those the principal may describe
                def visible(g: str) -> bool:
                    return self._guard.may_group(self._principal, Operation.DESCRIBE, g)
                states, types = filters
                shared = [(g, d.protocol_type, d.state, "share") for g, d in
                          kafka_share.described_groups(self._broker).items()
                          if visible(g) and (not states or d.state.lower() in states)
                          and (not types or "share" in types)]
                if h.api_version >= 3:
                    return list_groups_flex_response(h, response, cluster, visible, shared, types)
                return list_groups_response(h, response, cluster, visible, [(g, p) for g, p, _, _ in shared])
            if h.api_key == ApiKey.DESCRIBE_GROUPS:
                return with_described(h, describe_groups_response(h, response, cluster), local)
            return offsets_response(h, response, names)
        except NotifyError as e:   # no answer in the API's shape: close, the client reconnects and retries
            log.warning("Kafka connection from %s: %s; closing", self._peer, e)
            self._writer.close()
            return b""

    async def _delete_groups(self, h: RequestHeader, frame: bytes | memoryview, body_at: int,
                             groups: list[str]) -> bytes:
        """Each group deleted on its own coordinator (needs `admin` on the group); one answer."""
        results = []
        for g in groups:
            if not self._may_group(Operation.ADMIN, g):
                results.append((g, int(ErrorCode.GROUP_AUTHORIZATION_FAILED)))
                continue
            mapped = self._broker.groups.mapped(g)
            try:
                results.append((g, delete_group_result(
                    await self._link().relay(mapped, delete_group_request(frame, body_at, mapped)))))
            except (NotifyError, ProtocolError) as e:   # retriable for the client, unlike a close mid-list
                log.warning("Kafka connection from %s: deleting group %r: %s", self._peer, g, e)
                results.append((g, int(ErrorCode.COORDINATOR_NOT_AVAILABLE)))
        return encode_delete_groups(h, results)

    # --- Produce ---------------------------------------------------------------------------

    async def _produce(self, h: RequestHeader, req: ProduceRequest) -> asyncio.Future[bytes] | None:
        level = ack_level(req.acks)
        appended: list[tuple[str, int, list[Appended] | PartitionResult]] = []
        accepted: list[tuple[str, int]] = []   # (topic, record bytes) to charge to the quotas
        for topic, parts in req.topics:
            for part in parts:
                outcome: list[Appended] | PartitionResult
                if level is None:
                    outcome = PartitionResult(
                        part.index, ErrorCode.INVALID_REQUIRED_ACKS, message=f"acks={req.acks}: use 0, 1 or -1")
                elif req.transactional_id is not None:
                    outcome = PartitionResult(part.index, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                              message="memq has no Kafka transactions")
                else:
                    outcome = await self._append(topic, part, level)
                if isinstance(outcome, PartitionResult):
                    if outcome.error:
                        self._metrics.rejected.labels(f"kafka:{outcome.error.name}").inc()
                        log.info("Kafka produce to %s[%d] from %s: %s (%s)", topic, part.index, self._peer,
                                 outcome.error.name, outcome.message)
                else:
                    accepted.append((topic, len(part.records or b"")))
                appended.append((topic, part.index, outcome))
        self._throttle_s = self._broker.admission.charge(self._principal, accepted)
        if level is AckLevel.NONE:
            return None   # Kafka sends no response to acks=0
        wait_s = min(max(req.timeout_ms / 1000, MIN_ACK_WAIT_S), MAX_ACK_WAIT_S)
        return asyncio.ensure_future(self._produce_response(h, appended, wait_s, round(self._throttle_s * 1000)))

    async def _produce_response(self, h: RequestHeader,
                                appended: list[tuple[str, int, list[Appended] | PartitionResult]],
                                timeout_s: float, throttle_ms: int) -> bytes:
        futures = [f for _, _, o in appended if not isinstance(o, PartitionResult) for f, _ in o]
        if futures:
            await asyncio.wait(futures, timeout=timeout_s)
        result = ProduceResult(throttle_ms=throttle_ms)
        for topic, index, outcome in appended:
            result.topics.setdefault(topic, []).append(
                outcome if isinstance(outcome, PartitionResult) else _partition_result(index, outcome, timeout_s))
        return encode_produce(h, result)

    async def _append(self, topic: str, part: PartitionData, level: AckLevel
                      ) -> list[Appended] | PartitionResult:
        """Admit one partition's records, then append each RecordBatch as a Message: (its ack to come, its count)."""
        try:
            split: list[memoryview] | FormatError = split_kafka_batches(part.records) if part.records else []
        except FormatError as e:
            split = e   # reported after admission: who may write here is checked first
        largest = max((len(b) for b in split), default=0) + MESSAGE_HEADER_SIZE if isinstance(split, list) else 0
        admitted = self._broker.admission.admit(self._principal, topic, largest)
        if isinstance(admitted, Refusal):
            return self._refused(topic, part.index, admitted)
        if self._session is not None:
            self._session.produced(topic)
        if not 0 <= part.index < admitted.config.read_partitions:
            return PartitionResult(part.index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                   message=f"topic {topic} has {admitted.config.read_partitions} partitions")
        if not part.records:
            return PartitionResult(part.index, ErrorCode.CORRUPT_MESSAGE, message="no records")
        try:
            if isinstance(split, FormatError):
                raise split
            batches = [(b, verify_kafka_batch(b)) for b in split]
        except UnsupportedCodecError as e:
            return PartitionResult(part.index, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, message=str(e))
        except UnsupportedVersionError as e:
            return PartitionResult(part.index, ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT, message=str(e))
        except FormatError as e:
            return PartitionResult(part.index, ErrorCode.CORRUPT_MESSAGE, message=str(e))
        if any(kh.transactional for _, kh in batches):
            return PartitionResult(part.index, ErrorCode.INVALID_REQUEST,
                                   message="transactional batches: memq has no Kafka transactions")
        loop = asyncio.get_running_loop()
        futures: list[Appended] = []
        audited = self._audit if level is not AckLevel.NONE else None
        for b, kh in batches:
            if kh.producer_id >= 0:   # idempotent: a retry carries the same ids, so dedup drops it
                ids = (memq_producer_id(kh.producer_id, part.index), max(kh.producer_epoch, 0), kh.base_sequence)
            else:
                ids = (self._producer_id, 0, next(self._sequence))
            msg, header = encode_kafka_message(b, kh, producer_id=ids[0], epoch=ids[1], sequence=ids[2])
            fut: asyncio.Future[Ack] = loop.create_future()

            def reply(a: Ack, fut: asyncio.Future[Ack] = fut, h: MessageHeader = header, topic: str = topic,
                      audit: AuditEmitter | None = audited) -> None:
                if fut.done():
                    return
                fut.set_result(a)
                if a.ok and audit is not None:   # the broker stands in for the Kafka client's audit
                    audit.produced(topic=topic, producer_id=h.producer_id, epoch=h.epoch, sequence=h.sequence,
                                   count=h.count, digest=h.body_crc32c, created_ms=h.created_ms)

            await admitted.append(memoryview(msg), header, next(self._request_ids), level, reply)
            if not fut.done() or fut.result().ok:
                self._seal_credit.earn(len(msg))
            if not fut.done() and level is AckLevel.ALL:
                self._awaiting[topic] = admitted
            futures.append((fut, kh.count))
        return futures

    def _refused(self, topic: str, index: int, refusal: Refusal) -> PartitionResult:
        """A partition not admitted, in Kafka's terms (not the hot path)."""
        code = refusal.code
        if code is AckCode.UNKNOWN_TOPIC and topic in self._broker.metadata().topics:
            code = AckCode.NOT_HERE   # hosted elsewhere in the cluster: the client re-reads metadata
        return PartitionResult(index, error_code(code), -1, refusal.why)

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


def _partition_result(index: int, appended: list[Appended], timeout_s: float) -> PartitionResult:
    """The partition's answer once its Messages' acks are in: its first record's Kafka offset as
    a reader will see it (acks=all; negative, unknown, for acks=1: its notification is not published yet)."""
    placed = []
    for f, count in appended:
        if not f.done():
            return PartitionResult(index, ErrorCode.REQUEST_TIMED_OUT,
                                   message=f"not stored and notified within {timeout_s:g}s")
        ack = f.result()
        if not ack.ok:
            return PartitionResult(index, error_code(ack.code), message=ack.error)
        placed.append((ack.offset, ack.record, count))
    return PartitionResult(index, base_offset=produce_base_offset(placed))


#: What each relayed group API needs on its group (Kafka: READ, and DESCRIBE for OffsetFetch).
_GROUP_OPERATION = {ApiKey.OFFSET_COMMIT: Operation.CONSUME, ApiKey.OFFSET_FETCH: Operation.DESCRIBE,
                    ApiKey.JOIN_GROUP: Operation.CONSUME, ApiKey.SYNC_GROUP: Operation.CONSUME,
                    ApiKey.HEARTBEAT: Operation.CONSUME, ApiKey.LEAVE_GROUP: Operation.CONSUME}


def _no_groups(h: RequestHeader) -> bytes:
    """A DescribeGroups response describing no group (every one asked for was refused)."""
    w = Writer(h.correlation_id)
    if h.api_version >= 1:
        w.i32(0)
    return w.i32(0).frame()


def _ready(data: bytes) -> asyncio.Future[bytes]:
    f: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    f.set_result(data)
    return f
