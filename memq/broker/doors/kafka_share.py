"""The Kafka door's share groups (KIP-932): queues on memq topics, over the core's read path.

Who does what, so that every broker agrees without talking to the others:
- a share group's coordinator (FindCoordinator, ShareGroupHeartbeat, ShareGroupDescribe) is
  the broker with a Kafka listener picked by a hash of the group id (`memq.broker.coordinator`);
- a share-partition's state (which records are acquired, acknowledged, archived) is kept by the
  partition's leader in Metadata, the broker a share consumer sends its ShareFetch and
  ShareAcknowledge to; it is claimed from the store (`memq.broker.share.store`), which fences
  the previous owner, and written back in batches.
Records are read like a Fetch's (`BrokerCore.reads`: notifications, then parts through the
read cache, framed as RecordBatches); a client drops records outside its acquired ranges.
Archived records (rejected, or delivered `delivery_count_limit` times) are appended to the
group's dead-letter topic, with headers saying why, when that topic exists.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence

from memq.errors import FormatError, MemqError, OffsetOutOfRangeError, ProtocolError
from memq.format import Codec, LogMessage, encode_message, verify_message
from memq.format.kafka_records import decode_kafka_records
from memq.format.metadata import ClusterMetadata
from memq.format.wire import Ack, AckLevel
from memq.kafka_api.flexible import FlexReader, flex_body
from memq.kafka_api.groups import Described
from memq.kafka_api.mapping import metadata_view, node_id
from memq.kafka_api.metadata_flex import (FlexMetadataRequest, decode_metadata_flex, encode_metadata_flex,
                                          topic_id)
from memq.kafka_api.offsets import first_offset, split_offset
from memq.kafka_api.protocol import Node, Reader, RequestHeader
from memq.kafka_api.records import FramedBatch, FramedPart, place
from memq.kafka_api.share import (SHARE_ACKNOWLEDGE, SHARE_FETCH, SHARE_GROUP_DESCRIBE, SHARE_GROUP_HEARTBEAT,
                                  AckBatch, AckType, DescribedGroup, DescribedMember, Endpoint, Key,
                                  SharePartitionData, ShareError, decode_describe, decode_heartbeat,
                                  decode_share_acknowledge, decode_share_fetch, encode_describe, encode_heartbeat,
                                  encode_share_acknowledge, encode_share_fetch)
from memq.security.acl import Operation

from ..admission import Refusal
from ..coordinator import coordinator_of
from ..share.partition import AckOutcome, Archived, SharePartition
from ..share.service import Session
from ..seam import BrokerCore
from .kafka_family import Conn, Family, Response

log = logging.getLogger(__name__)

#: A ShareFetch that finds nothing waits at most this long for new records, whatever it asks.
MAX_WAIT_S = 5.0
DEFAULT_MAX_RECORDS = 500
#: A redelivered record's notification is in the past, so it is there: a read of it waits this long
#: for the tail to fetch it (a tail just moved back from the partition's end has nothing in memory).
REREAD_WAIT_S = 2.0


# --- Metadata v9-12 and FindCoordinator ----------------------------------------------------


def metadata(core: BrokerCore, principal: str | None, h: RequestHeader, body: FlexReader) -> bytes:
    """Metadata with topic ids (v10+), by name or by id."""
    req: FlexMetadataRequest = decode_metadata_flex(h.api_version, body)
    meta = core.metadata()
    names = req.names
    unknown: tuple[uuid.UUID, ...] = ()
    if req.ids:
        by_id = core.shares.topic_names(meta.cluster, meta.topics)
        names = tuple(names or ()) + tuple(by_id[i] for i in req.ids if i in by_id)
        unknown = tuple(i for i in req.ids if i not in by_id)
    meta = core.guard.visible(principal, meta, names or ())
    nodes, topics = metadata_view(meta, names)
    return encode_metadata_flex(h.api_version, h.correlation_id, nodes, meta.cluster,
                                node_id(core.broker_id), topics, unknown)


def described_groups(core: BrokerCore) -> dict[str, Described]:
    """The share groups this broker coordinates as ListGroups and DescribeGroups show them
    (protocol type "share", as Kafka's): admin tools list a broker's groups on each broker."""
    out = {}
    for gid, g in core.shares.groups.groups.items():
        members = tuple((m.member_id, m.client_id, m.client_host) for m in g.members.values())
        out[gid] = Described(gid, state="Stable" if members else "Empty", protocol_type="share", members=members)
    return out


def _endpoint(nodes: list[Node], nid: int) -> list[Endpoint]:
    return [Endpoint(n.node_id, n.host, n.port, n.rack) for n in nodes if n.node_id == nid]


# --- the door ------------------------------------------------------------------------------



class ShareDoor:
    """Answers one share-group request (a door object per request: the state is in `core.shares`)."""

    def __init__(self, core: BrokerCore, peer: object, principal: str | None) -> None:
        self._core = core
        self._principal = principal
        self._shares = core.shares
        self._peer = peer

    async def serve(self, h: RequestHeader, body: FlexReader) -> bytes:
        """The response; a frame that does not parse is answered INVALID_REQUEST in the API's shape."""
        try:
            if h.api_key == SHARE_GROUP_HEARTBEAT:
                return self.heartbeat(h, body)
            if h.api_key == SHARE_GROUP_DESCRIBE:
                return self.describe(h, body)
            if h.api_key == SHARE_FETCH:
                return await self.share_fetch(h, body)
            return await self.share_acknowledge(h, body)
        except ProtocolError as e:
            log.info("bad share request (API key %d) from %s: %s", h.api_key, self._peer, e)
            return invalid_request(h, str(e))

    def _may_group(self, operation: Operation, group: str) -> bool:
        """Whether the principal may do `operation` on `group` (ACL resource `group:NAME`), a
        refusal counted as a `group` denial: `consume` to be a member, fetch and acknowledge,
        `describe` to describe it."""
        guard = self._core.guard
        ok = guard.may_group(self._principal, operation, group)
        if not ok:
            guard.count_denial("group")
        return ok

    # --- topics ----------------------------------------------------------------------------

    def _topics(self) -> tuple[ClusterMetadata, dict[uuid.UUID, str]]:
        meta = self._core.metadata()
        return meta, self._shares.topic_names(meta.cluster, meta.topics)

    def _partitions(self, topics: Sequence[str]) -> list[Key]:
        meta = self._core.metadata()
        out: list[Key] = []
        for name in sorted(set(topics)):
            t = meta.topics.get(name)
            if t is not None:
                tid = topic_id(meta.cluster, name)
                out += [(tid, p) for p in range(t.read_partitions)]
        return out

    # --- ShareGroupHeartbeat, ShareGroupDescribe -------------------------------------------

    def heartbeat(self, h: RequestHeader, body: FlexReader) -> bytes:
        req = decode_heartbeat(body)
        interval = self._shares.config.heartbeat_interval_ms
        if not self._may_group(Operation.CONSUME, req.group_id):
            return encode_heartbeat(h.correlation_id, ShareError.GROUP_AUTHORIZATION_FAILED,
                                    f"principal {self._principal} may not consume group {req.group_id!r}", None, 0,
                                    interval, None)
        if coordinator_of(self._core.metadata(), req.group_id) != self._core.broker_id:
            return encode_heartbeat(h.correlation_id, ShareError.NOT_COORDINATOR, "not this group's coordinator",
                                    None, 0, interval, None)
        if not req.group_id:
            return encode_heartbeat(h.correlation_id, ShareError.INVALID_GROUP_ID, "empty group id", None, 0,
                                    interval, None)
        beat = self._shares.groups.heartbeat(req.group_id, req.member_id, req.member_epoch, req.rack_id, req.topics,
                                             self._partitions, client_id=h.client_id or "",
                                             client_host=str(self._peer))
        if beat.error:
            return encode_heartbeat(h.correlation_id, ShareError[beat.error], beat.error, None, 0, interval, None)
        assignment: dict[uuid.UUID, tuple[int, ...]] | None = None
        if beat.assignment is not None:
            grouped: dict[uuid.UUID, list[int]] = {}
            for tid, p in beat.assignment:
                grouped.setdefault(tid, []).append(p)
            assignment = {t: tuple(ps) for t, ps in grouped.items()}
        return encode_heartbeat(h.correlation_id, ShareError.NONE, None, beat.member_id, beat.epoch, interval,
                                assignment)

    def describe(self, h: RequestHeader, body: FlexReader) -> bytes:
        meta, names = self._topics()
        out = []
        for gid in decode_describe(body):
            g = self._shares.groups.groups.get(gid)
            if not self._may_group(Operation.DESCRIBE, gid):
                out.append(DescribedGroup(gid, ShareError.GROUP_AUTHORIZATION_FAILED,
                                          f"principal {self._principal} may not describe group {gid!r}"))
            elif coordinator_of(meta, gid) != self._core.broker_id:
                out.append(DescribedGroup(gid, ShareError.NOT_COORDINATOR, "not this group's coordinator"))
            elif g is None:
                out.append(DescribedGroup(gid, ShareError.GROUP_ID_NOT_FOUND, f"no share group {gid}"))
            else:
                members = []
                for m in g.members.values():
                    per: dict[uuid.UUID, list[int]] = {}
                    for tid, p in g.target.get(m.member_id, ()):
                        per.setdefault(tid, []).append(p)
                    members.append(DescribedMember(m.member_id, m.rack, m.epoch, m.client_id, m.client_host, m.topics,
                                                   tuple((t, names.get(t, ""), tuple(ps)) for t, ps in per.items())))
                out.append(DescribedGroup(gid, state="Stable" if members else "Empty", epoch=g.epoch,
                                          members=tuple(members)))
        return encode_describe(h.correlation_id, out)

    # --- ShareFetch, ShareAcknowledge ------------------------------------------------------

    def _session(self, group: str, member: str, epoch: int, keys: list[Key]) -> tuple[Session | None, ShareError]:
        for (g, m), gone in self._shares.expired_sessions():
            self._release(g, m, gone.keys)
        sessions = self._shares.sessions
        sid = (group, member)
        if epoch == 0:
            old = sessions.pop(sid, None)
            if old is not None:
                self._release(group, member, old.keys)
            s = sessions[sid] = Session(0, self._shares.now(), set(keys))
            return s, ShareError.NONE
        found = sessions.get(sid)
        if found is None:
            return None, ShareError.SHARE_SESSION_NOT_FOUND
        s = found
        s.seen = self._shares.now()
        if epoch == -1:
            del sessions[sid]
            return s, ShareError.NONE
        if epoch != s.epoch + 1:
            return None, ShareError.INVALID_SHARE_SESSION_EPOCH
        s.epoch = epoch
        s.keys.update(keys)
        return s, ShareError.NONE

    def _release(self, group: str, member: str, keys: set[Key]) -> None:
        _, names = self._topics()
        for tid, p in keys:
            sp = self._shares.partitions.get((group, names.get(tid, ""), p))
            if sp is not None:
                self._dead_letters(group, names.get(tid, ""), p, sp.release_member(member))

    def _leader(self, name: str, partition: int) -> tuple[int, list[Node]]:
        nodes, topics = metadata_view(self._core.metadata(), (name,))
        leaders = topics[0].leaders if topics else ()
        return (leaders[partition] if 0 <= partition < len(leaders) else -1), nodes

    def _refusal(self, names: dict[uuid.UUID, str], key: Key, out: SharePartitionData,
                 endpoints: list[Endpoint]) -> str | None:
        """The topic name when this broker serves `key`; else None with `out.error` set."""
        tid, p = key
        name = names.get(tid)
        if name is None:
            out.error = ShareError.UNKNOWN_TOPIC_ID
            return None
        guard = self._core.guard
        if guard.enabled and not guard.may(self._principal, Operation.CONSUME, name):
            guard.count_denial(Operation.CONSUME)
            out.error = ShareError.TOPIC_AUTHORIZATION_FAILED
            return None
        leader, nodes = self._leader(name, p)
        out.leader = leader
        if leader < 0:
            out.error = ShareError.UNKNOWN_TOPIC_OR_PARTITION
            return None
        if leader != node_id(self._core.broker_id):
            out.error = ShareError.NOT_LEADER_OR_FOLLOWER
            endpoints += [e for e in _endpoint(nodes, leader) if e not in endpoints]
            return None
        return name

    async def share_fetch(self, h: RequestHeader, body: FlexReader) -> bytes:
        req = decode_share_fetch(body)
        lock_ms = self._shares.config.record_lock_ms
        if not self._may_group(Operation.CONSUME, req.group_id):
            return encode_share_fetch(h.correlation_id, ShareError.GROUP_AUTHORIZATION_FAILED,
                                      f"principal {self._principal} may not consume group {req.group_id!r}", lock_ms, {}, [])
        session, err = self._session(req.group_id, req.member_id, req.session_epoch, list(req.partitions))
        if session is None:
            return encode_share_fetch(h.correlation_id, err, err.name, lock_ms, {}, [])
        _, names = self._topics()
        for key in req.forgotten:
            session.keys.discard(key)
        endpoints: list[Endpoint] = []
        outs: dict[Key, SharePartitionData] = {}
        served: dict[Key, str] = {}
        for key in list(req.partitions) + sorted(session.keys - set(req.partitions)):
            out = outs[key] = SharePartitionData(key[1])
            name = self._refusal(names, key, out, endpoints)
            if name is not None:
                served[key] = name
        acked = False
        for key, batches in req.partitions.items():
            if batches and key in served:
                out = outs[key]
                out.ack_error = await self._acknowledge(req.group_id, req.member_id, served[key], key[1], batches)
                acked = True
        closing = req.session_epoch == -1
        if closing:
            self._release(req.group_id, req.member_id, session.keys)
        elif req.max_records > 0 or req.max_bytes > 0:
            await self._fill(req.group_id, req.member_id, served, outs, req.max_records or DEFAULT_MAX_RECORDS,
                             max(req.max_bytes, 1), min(req.max_wait_ms / 1000, MAX_WAIT_S))
        if acked or closing:
            await self._shares.committed()
        topics: dict[uuid.UUID, list[SharePartitionData]] = {}
        for (tid, _), out in outs.items():
            topics.setdefault(tid, []).append(out)
        return encode_share_fetch(h.correlation_id, ShareError.NONE, None, lock_ms, topics, endpoints)

    async def share_acknowledge(self, h: RequestHeader, body: FlexReader) -> bytes:
        req = decode_share_acknowledge(body)
        if not self._may_group(Operation.CONSUME, req.group_id):
            return encode_share_acknowledge(h.correlation_id, ShareError.GROUP_AUTHORIZATION_FAILED,
                                            f"principal {self._principal} may not consume group {req.group_id!r}", {}, [])
        session, err = self._session(req.group_id, req.member_id, req.session_epoch, [])
        if session is None:
            return encode_share_acknowledge(h.correlation_id, err, err.name, {}, [])
        _, names = self._topics()
        endpoints: list[Endpoint] = []
        topics: dict[uuid.UUID, list[tuple[int, ShareError, str | None, int]]] = {}
        for key, batches in req.partitions.items():
            out = SharePartitionData(key[1])
            name = self._refusal(names, key, out, endpoints)
            code = out.error if name is None else await self._acknowledge(
                req.group_id, req.member_id, name, key[1], batches)
            topics.setdefault(key[0], []).append((key[1], code, None if not code else code.name, out.leader))
        if req.session_epoch == -1:
            self._release(req.group_id, req.member_id, session.keys)
        await self._shares.committed()
        return encode_share_acknowledge(h.correlation_id, ShareError.NONE, None, topics, endpoints)

    async def _acknowledge(self, group: str, member: str, name: str, partition: int,
                           batches: tuple[AckBatch, ...]) -> ShareError:
        key = (group, name, partition)
        try:
            sp = await self._shares.partition(key)
        except MemqError as e:
            log.warning("share-partition %s: state unavailable: %s", key, e)
            return ShareError.KAFKA_STORAGE_ERROR
        ok = True
        for b in batches:
            if len(b.types) == 1:
                runs = [(b.first, b.last, b.types[0])]
            else:
                runs = [(b.first + i, b.first + i, t) for i, t in enumerate(b.types)]
            for first, last, t in runs:
                if t is AckType.GAP:
                    continue
                good, archived = sp.acknowledge(member, first, last, AckOutcome(int(t)))
                ok = ok and good
                self._dead_letters(group, name, partition, archived)
        return ShareError.NONE if ok else ShareError.INVALID_RECORD_STATE

    # --- acquiring records -----------------------------------------------------------------

    async def _fill(self, group: str, member: str, served: dict[Key, str], outs: dict[Key, SharePartitionData],
                    max_records: int, max_bytes: int, wait_s: float) -> None:
        """Acquire what is there; when nothing is, wait up to `wait_s` for the next notification of
        any partition, then acquire again. The waits are never cancelled (a tail's read must not
        be, or the notifications it polled are lost): one still waiting when another's data came
        finishes on its own, into its tail's memory, where the next fetch finds it."""
        budget = [max_records, max_bytes]
        for key, name in served.items():
            await self._acquire(group, member, name, key, outs[key], budget)
        if wait_s <= 0 or not served or any(outs[k].acquired for k in served):
            return
        meta = self._core.metadata()
        waits = []
        for key, name in served.items():
            sp = self._shares.partitions.get((group, name, key[1]))
            if sp is not None and sp.started and sp.room() > 0 and not outs[key].error:
                waits.append(asyncio.ensure_future(self._core.reads.notes(
                    meta.topics[name].notification_topic, key[1], split_offset(sp.end)[0], wait_s)))
        if not waits:
            return
        await asyncio.wait(waits, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:   # an abandoned wait's error is the next fetch's to see
            w.add_done_callback(lambda f: f.cancelled() or f.exception())
        for key, name in served.items():
            await self._acquire(group, member, name, key, outs[key], budget)

    async def _acquire(self, group: str, member: str, name: str, key: Key, out: SharePartitionData,
                       budget: list[int]) -> None:
        """Acquire records of one partition for `member` into `out`: redeliveries first, then new ones."""
        skey = (group, name, key[1])
        try:
            sp = await self._shares.partition(skey)
        except MemqError as e:
            log.warning("share-partition %s: state unavailable: %s", skey, e)
            out.error = ShareError.KAFKA_STORAGE_ERROR
            return
        ntopic = self._core.metadata().topics[name].notification_topic
        async with self._shares.lock(skey):
            try:
                self._dead_letters(group, name, key[1], sp.expire())
                if not sp.started:
                    low, high = await self._core.reads.watermarks(ntopic, key[1])
                    earliest = self._shares.config.auto_offset_reset == "earliest"
                    sp.begin(first_offset(low if earliest else high))
                again = sp.redeliverable(budget[0])
                if again:
                    await self._redeliver(sp, member, ntopic, key[1], again, out, budget)
                elif budget[0] > 0 and sp.room() > 0:
                    await self._read_new(sp, member, ntopic, key[1], out, budget)
            except OffsetOutOfRangeError:   # retention moved the log start past the window
                low, _ = await self._core.reads.watermarks(ntopic, key[1])
                sp.skip_to(first_offset(low))
            except FormatError as e:
                out.error = ShareError.UNKNOWN_SERVER_ERROR
                log.warning("share fetch of %s[%d] from %s: %s", name, key[1], self._peer, e)
            except MemqError as e:
                out.error = ShareError.KAFKA_STORAGE_ERROR
                log.warning("share fetch of %s[%d] from %s: %s", name, key[1], self._peer, e)

    async def _part(self, ntopic: str, partition: int, note: int, wait_s: float = 0.0
                    ) -> tuple[int, int, FramedPart] | None:
        """(notification offset, record count, framed part) of the first part at or after `note`,
        waiting up to `wait_s` for its notification."""
        notes = await self._core.reads.notes(ntopic, partition, note, wait_s)
        if not notes:
            return None
        n = notes[0]
        return n.offset, n.notification.logmessage_count, await self._core.reads.part(n.notification)

    async def _read_new(self, sp: SharePartition, member: str, ntopic: str, partition: int, out: SharePartitionData,
                        budget: list[int]) -> None:
        while budget[0] > 0 and budget[1] > 0 and sp.room() > 0:
            note, index = split_offset(sp.end)
            got = await self._part(ntopic, partition, note)
            if got is None:
                return
            n, count, part = got
            start = index if n == note else 0
            buf = bytearray()
            wanted = FramedPart(_batches(part, start, min(budget[0], sp.room()), budget[1]))
            after = place(wanted, n, start, buf, budget[1], at_least_one=not out.records)
            if after > start:
                self._take(sp, member, out, buf, [first_offset(n) | i for i in range(start, after)], budget)
            if sp.end < first_offset(n) + count:
                return   # stopped inside the part (a limit, or the window is full)
            sp.skip_to(first_offset(n + 1))

    async def _redeliver(self, sp: SharePartition, member: str, ntopic: str, partition: int, offsets: list[int],
                         out: SharePartitionData, budget: list[int]) -> None:
        by_note: dict[int, list[int]] = {}
        for off in offsets:
            by_note.setdefault(split_offset(off)[0], []).append(off)
        for note, offs in by_note.items():   # it was read before: wait for it to be read again
            got = await self._part(ntopic, partition, note, REREAD_WAIT_S)
            if got is None or got[0] != note:
                continue
            buf = bytearray()
            place(part := got[2], note, split_offset(offs[0])[1], buf, max(budget[1], 1), at_least_one=True)
            del part
            self._take(sp, member, out, buf, offs, budget)

    def _take(self, sp: SharePartition, member: str, out: SharePartitionData, buf: bytearray, offsets: list[int],
              budget: list[int]) -> None:
        ranges = sp.acquire(member, offsets)
        if not ranges:
            return
        out.records += buf
        out.acquired += ranges
        budget[0] -= sum(last - first + 1 for first, last, _ in ranges)
        budget[1] -= len(buf)

    # --- dead letters ----------------------------------------------------------------------

    def _dead_letters(self, group: str, name: str, partition: int, archived: list[Archived]) -> None:
        suffix = self._shares.config.dead_letter_suffix
        if archived and suffix:
            self._shares.spawn(self._send_dead_letters(group, name, partition, archived, group + suffix))

    async def _send_dead_letters(self, group: str, name: str, partition: int, archived: list[Archived],
                                 dlq: str) -> None:
        """Append the archived records, with why, to the group's dead-letter topic (if it exists here)."""
        meta = self._core.metadata()
        if dlq not in meta.topics:
            return
        ntopic = meta.topics[name].notification_topic
        records = []
        for a in archived:
            note, index = split_offset(a.offset)
            try:
                got = await self._part(ntopic, partition, note, REREAD_WAIT_S)
                rec = _record_at(got[2], index) if got is not None and got[0] == note else None
            except MemqError as e:
                log.warning("dead letter %s[%d]@%d not read: %s", name, partition, a.offset, e)
                rec = None
            headers = (("reason", a.reason.encode()), ("topic", name.encode()), ("partition", b"%d" % partition),
                       ("offset", b"%d" % a.offset), ("group", group.encode()), ("delivery_count", b"%d" % a.deliveries))
            records.append(LogMessage(rec.value if rec else b"", rec.key if rec else None,
                                      (rec.headers if rec else ()) + headers, rec.timestamp_ms if rec else 0))
        msg = encode_message(records, producer_id=self._shares.producer_id, epoch=0,
                             sequence=next(self._shares.sequence), codec=Codec.NONE)
        header = verify_message(msg)
        ticket = self._core.admission.admit(None, dlq, len(msg))
        if isinstance(ticket, Refusal):
            log.warning("dead letters of group %s not appended to %s: %s", group, dlq, ticket.why)
            return

        def stored(a: Ack) -> None:
            if a.ok:
                self._shares.dead_letters[group] = self._shares.dead_letters.get(group, 0) + len(records)
            else:
                log.warning("dead letters of group %s not stored in %s: %s", group, dlq, a.error)

        await ticket.append(memoryview(msg), header, next(self._shares.sequence), AckLevel.LEADER, stored)


def _batches(part: FramedPart, start: int, records: int, nbytes: int) -> tuple[FramedBatch, ...]:
    """The part's batches from record `start` on, whole, until `records` records or `nbytes` bytes
    are reached (a ShareFetch's max_records is best effort in Kafka too: whole batches go, so a
    client never parses a batch to use a slice of it)."""
    out: list[FramedBatch] = []
    for b in part.batches:
        if b.first_index + b.count <= start:
            continue
        if out and (records <= 0 or nbytes <= 0):
            break
        out.append(b)
        records -= b.first_index + b.count - max(start, b.first_index)
        nbytes -= len(b.data)
    return tuple(out)


def invalid_request(h: RequestHeader, why: str) -> bytes:
    """INVALID_REQUEST in the shape of the response to `h` (a share API)."""
    e, c = ShareError.INVALID_REQUEST, h.correlation_id
    if h.api_key == SHARE_GROUP_HEARTBEAT:
        return encode_heartbeat(c, e, why, None, 0, 0, None)
    if h.api_key == SHARE_GROUP_DESCRIBE:
        return encode_describe(c, [DescribedGroup("", e, why)])
    if h.api_key == SHARE_FETCH:
        return encode_share_fetch(c, e, why, 0, {}, [])
    return encode_share_acknowledge(c, e, why, {}, [])


def _record_at(part: FramedPart, index: int) -> LogMessage | None:
    for b in part.batches:
        if b.first_index <= index < b.first_index + b.count:
            return decode_kafka_records(b.data)[index - b.first_index]
    return None


async def serve(conn: Conn, h: RequestHeader, body: Reader) -> Response:
    return asyncio.ensure_future(ShareDoor(conn.core, conn.peer, conn.principal).serve(h, flex_body(body)))


FAMILY = Family("share", dict.fromkeys((SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_FETCH, SHARE_ACKNOWLEDGE),
                                      (1, 1)),
                "consume on the group and the topic (describe to describe the group)", serve)
