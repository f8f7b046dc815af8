"""A broker's share groups: the groups it coordinates, the share-partitions it leads, their
writes, and what a share consumer's fetches and acknowledgements do to them.

A share-partition's state lives on the broker that leads its partition in Metadata: it is
claimed from the store on first use (fencing the previous owner) and written back in batches:
every `flush_ms` all the partitions changed since the last flush are written, one write each,
and the requests that changed them are answered after that write (`committed`), so an answered
acknowledgement survives a broker restart. A fenced write drops the partition here; its next
fetch here claims it again, and the client re-reads Metadata meanwhile.

Records are read like a Fetch's (`ShareBroker.reads`: notifications, then parts through the
read cache, framed as RecordBatches); a client drops records outside its acquired ranges. What a
member acquires from a part, and what an acknowledgement applies, is `delivery`'s (pure); the
sessions are `session`'s (pure). Archived records (rejected, or delivered `delivery_count_limit`
times) are appended to the group's dead-letter topic, with headers saying why, when that topic
exists, through the broker's produce admission.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import uuid
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol, TypeVar

from memq.clock import Clock
from memq.config import ShareConfig
from memq.errors import CoordinationError, FormatError, MemqError, OffsetOutOfRangeError, StateFencedError
from memq.format import Codec, MessageHeader, Notification, encode_message, verify_message
from memq.format.metadata import ClusterMetadata, TopicMetadata
from memq.format.wire import Ack, AckLevel
from memq.kafka_api.groups import Described
from memq.kafka_api.metadata_flex import topic_id
from memq.kafka_api.records import FramedPart
from memq.kafka_api.share import AckBatch, ShareError, SharePartitionData
from memq.log.model import PartitionLog
from memq.notify.consumer import NotificationRecord

from ..admission import Refusal
from .delivery import Budget, acknowledge, by_note, dead_letter, record_at, take_again, take_new
from .membership import ShareGroups
from .partition import Archived, SharePartition, Snapshot
from .session import Key, Session, ShareSessions
from .store import ShareStateStore, StateKey

log = logging.getLogger(__name__)
T = TypeVar("T")


#: A redelivered record's notification is in the past, so it is there: a read of it waits this long
#: for the tail to fetch it (a tail just moved back from the partition's end has nothing in memory).
REREAD_WAIT_S = 2.0


class ShareReads(Protocol):
    """What share groups read through the broker's read path (`memq.broker.reads.Reads`)."""

    async def notes(self, notification_topic: str, partition: int, offset: int, wait_s: float
                    ) -> list[NotificationRecord]:
        """The partition's notifications from `offset`, waiting up to `wait_s` for one."""

    async def part(self, note: Notification) -> FramedPart:
        """The part `note` announces, framed as Kafka RecordBatches."""

    async def watermarks(self, notification_topic: str, partition: int) -> tuple[int, int]:
        """(first, next) notification offsets."""


class Appender(Protocol):
    async def append(self, message: memoryview, header: MessageHeader, request_id: int, level: AckLevel,
                     reply: Callable[[Ack], None], *, seal: bool = False) -> None:
        """`reply` gets the Message's ack exactly once (`admission.Ticket`)."""


class DeadLetterAdmission(Protocol):
    def admit(self, principal: str | None, topic: str, largest: int) -> Appender | Refusal:
        """The produce admission dead letters go through (`admission.Admission`)."""


class ShareLogs(Protocol):
    """A partition's offsets, as every reader numbers them (`memq.broker.logs.Logs`)."""

    async def started(self, topic: TopicMetadata, partition: int, high: int | None = None) -> PartitionLog: ...
    async def counted(self, plog: PartitionLog, topic: TopicMetadata, partition: int,
                      notes: list[NotificationRecord]) -> None: ...


class ShareBroker(Protocol):
    """What share groups use of the broker: its cluster view, its read path, its partitions'
    offsets and, for dead letters, its produce admission."""

    def metadata(self) -> ClusterMetadata: ...

    @property
    def reads(self) -> ShareReads: ...

    @property
    def logs(self) -> ShareLogs: ...

    @property
    def admission(self) -> DeadLetterAdmission: ...


class Shares:
    """One broker's share groups; `broker` is what fetches, acknowledgements and dead letters use."""

    def __init__(self, config: ShareConfig, store: ShareStateStore, clock: Clock, owner: str,
                 broker: ShareBroker) -> None:
        self.config = config
        self._broker = broker
        self.store = store
        self._clock = clock
        self._owner = owner
        self.groups = ShareGroups(clock, session_s=config.session_timeout_ms / 1000)
        self.partitions: dict[StateKey, SharePartition] = {}
        self._versions: dict[StateKey, int] = {}
        self._loading: dict[StateKey, asyncio.Task[SharePartition]] = {}
        self._flushed: asyncio.Future[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self.locks: dict[StateKey, asyncio.Lock] = {}
        self.writes = 0
        self.sessions = ShareSessions(config.session_timeout_ms / 1000)
        self.producer_id = secrets.randbits(63)   # of the dead letters this broker appends
        self.sequence = itertools.count()
        self.dead_letters: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._ids: dict[str, uuid.UUID] = {}   # per group: records appended to its dead-letter topic

    def topic_names(self, cluster: str, names: Iterable[str]) -> dict[uuid.UUID, str]:
        """Kafka topic id -> name of `names` (ids are a hash: computed once per name here)."""
        ids = self._ids
        for n in names:
            if n not in ids:
                ids[n] = topic_id(cluster, n)
        return {ids[n]: n for n in names}

    def described(self) -> dict[str, Described]:
        """The share groups this broker coordinates as ListGroups and DescribeGroups show them
        (protocol type "share", as Kafka's): admin tools list a broker's groups on each broker."""
        out = {}
        for gid, g in self.groups.groups.items():
            members = tuple((m.member_id, m.client_id, m.client_host) for m in g.members.values())
            out[gid] = Described(gid, state="Stable" if members else "Empty", protocol_type="share", members=members)
        return out

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in the background, held here until it ends (the loop keeps tasks weakly)."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def now(self) -> float:
        return self._clock.monotonic()

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    async def partition(self, key: StateKey) -> SharePartition:
        """The share-partition's state, claimed from the store on first use here."""
        sp = self.partitions.get(key)
        if sp is not None:
            return sp
        task = self._loading.get(key)
        if task is None:
            task = self._loading[key] = asyncio.get_running_loop().create_task(self._claim(key))
        return await asyncio.shield(task)

    async def _claim(self, key: StateKey) -> SharePartition:
        try:
            snapshot, version = await self._run(self.store.claim, key, self._owner)
            c = self.config
            sp = SharePartition(self._clock, lock_s=c.record_lock_ms / 1000, delivery_limit=c.delivery_count_limit,
                                max_in_flight=c.max_in_flight, snapshot=snapshot)
            self.partitions[key], self._versions[key] = sp, version
            self.locks.setdefault(key, asyncio.Lock())
            return sp
        finally:
            del self._loading[key]

    def lock(self, key: StateKey) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    def drop(self, key: StateKey) -> None:
        """Forget a partition this broker no longer owns (fenced, or its leadership moved)."""
        self.partitions.pop(key, None)
        self._versions.pop(key, None)

    async def committed(self) -> None:
        """Return once every change made so far is written (the next batched flush)."""
        if not any(sp.changed for sp in self.partitions.values()):
            return
        if self._flushed is None:
            self._flushed = asyncio.get_running_loop().create_future()
        done = self._flushed
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_soon())
        await asyncio.shield(done)

    async def _flush_soon(self) -> None:
        await asyncio.sleep(self.config.flush_ms / 1000)
        await self.flush()

    async def flush(self) -> None:
        """Write every changed partition once; wake the requests waiting on it."""
        waiting, self._flushed = self._flushed, None
        dirty = [(k, self._versions[k], sp.snapshot()) for k, sp in self.partitions.items()
                 if sp.changed and k in self._versions]
        try:
            if dirty:
                results = await self._run(self._write_all, dirty)
                for key, result in results:
                    self._written(key, result)
        finally:
            if waiting is not None and not waiting.done():
                waiting.set_result(None)

    def _write_all(self, dirty: list[tuple[StateKey, int, Snapshot]]) -> list[tuple[StateKey, int | MemqError]]:
        out: list[tuple[StateKey, int | MemqError]] = []
        for key, version, snap in dirty:
            try:
                out.append((key, self.store.write(key, self._owner, snap, version)))
            except MemqError as e:
                out.append((key, e))
        return out

    def _written(self, key: StateKey, result: int | MemqError) -> None:
        if isinstance(result, int):
            self._versions[key] = result
            self.writes += 1
        elif isinstance(result, StateFencedError):
            log.warning("share-partition %s: %s; dropping it here", key, result)
            self.drop(key)
        else:   # kept dirty: the next flush tries again
            log.warning("share-partition %s: state not written: %s", key, result)
            sp = self.partitions.get(key)
            if sp is not None:
                sp.changed = True

    async def reset(self, key: StateKey, offset: int) -> None:
        """Move a share-partition's start to `offset` (-1: forget it) and return once that is written:
        claimed here, so the store fences the broker that held it (it re-claims the new state at its
        next write). A copy here that was fenced meanwhile is claimed again, once. Raises MemqError
        when the write failed."""
        for attempt in (1, 2):
            sp = await self.partition(key)
            async with self.lock(key):
                sp.reset(offset)
            await self.committed()
            if self.partitions.get(key) is sp and not sp.changed:
                return
            if self.partitions.get(key) is sp or attempt == 2:
                raise CoordinationError(f"share state {key}: reset to {offset} not written")

    async def stored(self, group: str) -> list[StateKey]:
        """The share-partitions `group` has state for in the store."""
        return await self._run(self.store.keys, group)

    async def start_of(self, key: StateKey) -> int:
        """The share-partition's start offset (-1: no state): this broker's if it holds it, else the store's."""
        sp = self.partitions.get(key)
        if sp is not None:
            return sp.start
        snap = await self._run(self.store.read, key)
        return -1 if snap is None else snap.start

    # --- sessions, acknowledgements, fetches ---------------------------------------------------

    def _names(self) -> dict[uuid.UUID, str]:
        meta = self._broker.metadata()
        return self.topic_names(meta.cluster, meta.topics)

    def open_session(self, group: str, member: str, epoch: int, keys: list[Key]) -> tuple[Session | None, ShareError]:
        """The member's session for a request at `epoch` naming `keys` (`session.ShareSessions`),
        or None and why; what expired sessions and a replaced one held is released first."""
        now = self.now()
        for (g, m), gone in self.sessions.expired(now):
            self.release(g, m, gone.keys)
        session, error, replaced = self.sessions.step(group, member, epoch, keys, now)
        if replaced is not None:
            self.release(group, member, replaced.keys)
        return session, error

    def release(self, group: str, member: str, keys: Iterable[Key]) -> None:
        """`member` left (or its session ended): its acquired records of `keys` are available again."""
        names = self._names()
        for tid, p in keys:
            name = names.get(tid, "")
            sp = self.partitions.get((group, name, p))
            if sp is not None:
                self._dead_letters(group, name, p, sp.release_member(member))

    async def acknowledge(self, group: str, member: str, name: str, partition: int,
                          batches: Iterable[AckBatch]) -> ShareError:
        """Apply `member`'s acknowledgement of topic `name`'s `partition` (answer it once
        `committed`): INVALID_RECORD_STATE if a record of it was not the member's to acknowledge."""
        key = (group, name, partition)
        try:
            sp = await self.partition(key)
        except MemqError as e:
            log.warning("share-partition %s: state unavailable: %s", key, e)
            return ShareError.KAFKA_STORAGE_ERROR
        ok, archived = acknowledge(sp, member, batches)
        self._dead_letters(group, name, partition, archived)
        return ShareError.NONE if ok else ShareError.INVALID_RECORD_STATE

    async def fetch(self, group: str, member: str, served: dict[Key, str], outs: dict[Key, SharePartitionData],
                    max_records: int, max_bytes: int, wait_s: float) -> None:
        """Acquire records of the `served` partitions (topic names by key) for `member` into
        `outs`; when there are none, wait up to `wait_s` for the next notification of any
        partition, then acquire again. The waits are never cancelled (a tail's read must not be,
        or the notifications it polled are lost): one still waiting when another's data came
        finishes on its own, into its tail's memory, where the next fetch finds it."""
        budget = Budget(max_records, max_bytes)
        for key, name in served.items():
            await self._acquire(group, member, name, key, outs[key], budget)
        if wait_s <= 0 or not served or any(outs[k].acquired for k in served):
            return
        broker = self._broker
        meta = broker.metadata()
        waits = []
        for key, name in served.items():
            sp = self.partitions.get((group, name, key[1]))
            if sp is not None and sp.started and sp.room() > 0 and not outs[key].error:
                plog = await broker.logs.started(meta.topics[name], key[1])
                waits.append(asyncio.ensure_future(broker.reads.notes(
                    meta.topics[name].notification_topic, key[1], plog.scheme.position_of(sp.end)[0], wait_s)))
        if not waits:
            return
        await asyncio.wait(waits, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:   # an abandoned wait's error is the next fetch's to see
            w.add_done_callback(lambda f: f.cancelled() or f.exception())
        for key, name in served.items():
            await self._acquire(group, member, name, key, outs[key], budget)

    async def _acquire(self, group: str, member: str, name: str, key: Key, out: SharePartitionData,
                       budget: Budget) -> None:
        """Acquire records of one partition for `member` into `out`: redeliveries first, then new ones."""
        skey = (group, name, key[1])
        try:
            sp = await self.partition(skey)
        except MemqError as e:
            log.warning("share-partition %s: state unavailable: %s", skey, e)
            out.error = ShareError.KAFKA_STORAGE_ERROR
            return
        reads = self._broker.reads
        topic = self._broker.metadata().topics[name]
        ntopic = topic.notification_topic
        async with self.lock(skey):
            try:
                self._dead_letters(group, name, key[1], sp.expire())
                plog = await self._broker.logs.started(topic, key[1])
                scheme = plog.scheme
                if not sp.started:
                    low, high = await reads.watermarks(ntopic, key[1])
                    sp.begin(scheme.start_of(low if self.config.auto_offset_reset == "earliest" else high))
                again = sp.redeliverable(budget.records)
                if again:
                    for note, offsets in by_note(again, scheme).items():   # read before: wait for it to be read again
                        got = await self._part(plog, topic, key[1], note, REREAD_WAIT_S)
                        if got is not None and got[0] == note:
                            take_again(sp, member, out, budget, scheme, note, offsets, got[2])
                elif budget.records > 0 and sp.room() > 0:
                    while budget.records > 0 and budget.nbytes > 0 and sp.room() > 0:
                        got = await self._part(plog, topic, key[1], scheme.position_of(sp.end)[0])
                        if got is None or not take_new(sp, member, out, budget, scheme, *got):
                            break
            except OffsetOutOfRangeError:   # retention moved the log start past the window
                low, _ = await reads.watermarks(ntopic, key[1])
                sp.skip_to((await self._broker.logs.started(topic, key[1])).scheme.start_of(low))
            except FormatError as e:
                out.error = ShareError.UNKNOWN_SERVER_ERROR
                log.warning("share fetch of %s[%d] for group %s: %s", name, key[1], group, e)
            except MemqError as e:
                out.error = ShareError.KAFKA_STORAGE_ERROR
                log.warning("share fetch of %s[%d] for group %s: %s", name, key[1], group, e)

    async def _part(self, plog: PartitionLog, topic: TopicMetadata, partition: int, note: int, wait_s: float = 0.0
                    ) -> tuple[int, int, FramedPart] | None:
        """(notification offset, record count, framed part) of the first part at or after `note`,
        waiting up to `wait_s` for its notification (counted: its records' offsets known)."""
        reads = self._broker.reads
        notes = await reads.notes(topic.notification_topic, partition, note, wait_s)
        await self._broker.logs.counted(plog, topic, partition, notes)
        if not notes:
            return None
        n = notes[0]
        return n.offset, n.notification.logmessage_count, await reads.part(n.notification)

    # --- dead letters --------------------------------------------------------------------------

    def _dead_letters(self, group: str, name: str, partition: int, archived: list[Archived]) -> None:
        suffix = self.config.dead_letter_suffix
        if archived and suffix:
            self.spawn(self._send_dead_letters(group, name, partition, archived, group + suffix))

    async def _send_dead_letters(self, group: str, name: str, partition: int, archived: list[Archived],
                                 dlq: str) -> None:
        """Append the archived records, with why, to the group's dead-letter topic (if it exists here)."""
        broker = self._broker
        meta = broker.metadata()
        if dlq not in meta.topics:
            return
        topic = meta.topics[name]
        records = []
        for a in archived:
            try:
                plog = await broker.logs.started(topic, partition)
                note, index = plog.scheme.position_of(a.offset)
                got = await self._part(plog, topic, partition, note, REREAD_WAIT_S)
                rec = record_at(got[2], index) if got is not None and got[0] == note else None
            except MemqError as e:
                log.warning("dead letter %s[%d]@%d not read: %s", name, partition, a.offset, e)
                rec = None
            records.append(dead_letter(a, rec, group, name, partition))
        msg = encode_message(records, producer_id=self.producer_id, epoch=0, sequence=next(self.sequence),
                             codec=Codec.NONE)
        header = verify_message(msg)
        ticket = broker.admission.admit(None, dlq, len(msg))
        if isinstance(ticket, Refusal):
            log.warning("dead letters of group %s not appended to %s: %s", group, dlq, ticket.why)
            return

        def stored(a: Ack) -> None:
            if a.ok:
                self.dead_letters[group] = self.dead_letters.get(group, 0) + len(records)
            else:
                log.warning("dead letters of group %s not stored in %s: %s", group, dlq, a.error)

        await ticket.append(memoryview(msg), header, next(self.sequence), AckLevel.LEADER, stored)

    async def close(self) -> None:
        """Finish the dead letters under way, write what changed (a graceful stop loses no acknowledgement)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
        if self._flusher is not None:
            self._flusher.cancel()
        await self.flush()
