"""A broker's group coordinator: the Kafka consumer groups `coordinator_of` gives it, their
members (KIP-848 `consumer` groups and `classic` ones, pure in `consumer` and `classic`) and
their committed offsets, kept in the cluster's store (`store`).

A group is claimed from the store on its first call here (which fences the broker that held it
before) and then kept in memory; every change of its state is written before the call that made
it is answered, every commit before it is acknowledged, so a coordinator that takes a group over
after a crash carries on with the same members, epochs and offsets. A write refused because
another broker claimed the group drops it here: the caller answers NOT_COORDINATOR and the
client finds the coordinator again. A group whose coordinator is another broker now (brokers
came or went) is dropped the same way on its next call.

A group changes protocol with members in it as Kafka 4's does (`migration`, under `[group]
migration_policy`): a classic group becomes a consumer group when a consumer-protocol member
joins, and classic members are then served by the consumer group (`consumer`), their JoinGroup,
SyncGroup and Heartbeat answered from its state; it turns classic again when only classic
members are left.

A group seen for the first time takes over the offsets committed through the relay to the
notification Kafka before memq coordinated groups (`legacy`, read once: the migration path).

Calls that wait (a classic JoinGroup, a follower's SyncGroup) get futures, answered by the
calls that complete them or by the ticker (timeouts, every `tick_ms`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from memq.clock import Clock
from memq.config import GroupConfig
from memq.errors import MemqError, ProtocolError, StateFencedError
from memq.format.metadata import ClusterMetadata
from memq.kafka_api import embedded
from memq.kafka_api.protocol import ErrorCode

from ..coordinator import not_coordinator
from . import classic, consumer, migration
from .classic import Answer, ClassicGroups, JoinAnswer, Protocols, SyncAnswer
from .consumer import Beat, ConsumerGroups
from .migration import MigrationPolicy
from .store import GroupStore, Offsets

log = logging.getLogger(__name__)

Legacy = Callable[[str], Awaitable[Offsets]]   # a group's offsets committed through the old relay
CONSUMER, CLASSIC = "consumer", "classic"


@dataclass(slots=True)
class Held:
    """A group this broker coordinates: its kind and the store version it writes against."""

    kind: str | None
    version: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(frozen=True, slots=True)
class Member:
    """A member as the describe calls show it."""

    member_id: str
    client_id: str
    client_host: str
    instance_id: str | None = None
    epoch: int = -1                                   # consumer groups
    rack: str | None = None
    topics: tuple[str, ...] = ()
    regex: str | None = None
    assigned: frozenset[tuple[str, int]] = frozenset()
    target: frozenset[tuple[str, int]] = frozenset()
    metadata: bytes = b""                             # classic groups: the chosen protocol's
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class Description:
    group_id: str
    error: ErrorCode
    kind: str = ""
    state: str = "Dead"
    protocol_type: str = ""
    protocol: str = ""
    epoch: int = 0
    assignment_epoch: int = 0
    assignor: str = ""
    members: tuple[Member, ...] = ()


class GroupCoordinator:
    """The groups this broker coordinates (`memq.broker.coordinator.coordinator_of`)."""

    def __init__(self, config: GroupConfig, store: GroupStore, clock: Clock, broker_id: str,
                 metadata: Callable[[], ClusterMetadata], legacy: Legacy | None = None) -> None:
        self.config = config
        self._store = store
        self._clock = clock
        self.broker_id = broker_id
        self._metadata = metadata
        self._legacy = legacy
        self.consumer = ConsumerGroups(session_s=config.session_timeout_ms / 1000)
        self.classic = ClassicGroups(initial_delay_s=config.initial_rebalance_delay_ms / 1000)
        self.policy = MigrationPolicy(config.migration_policy)
        self._held: dict[str, Held] = {}
        self._claiming: dict[str, asyncio.Future[Held]] = {}
        self._waiting: dict[tuple[str, str], asyncio.Future[JoinAnswer | SyncAnswer]] = {}
        self._ticker: asyncio.Task[None] | None = None
        self._seen: dict[str, Mapping[str, int]] = {}   # the partitions a consumer group's target was made for

    def start(self) -> None:
        self._ticker = asyncio.ensure_future(self._tick_forever())

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
        for fut in self._waiting.values():
            fut.cancel()

    # --- KIP-848 consumer groups -------------------------------------------------------------

    async def heartbeat(self, group: str, member_id: str, epoch: int, *, topics: tuple[str, ...] | None = None,
                        regex: str | None = None, owned: frozenset[tuple[str, int]] | None = None,
                        assignor: str | None = None, rebalance_timeout_s: float | None = None, instance_id: str | None = None,
                        rack: str | None = None, client_id: str = "", client_host: str = "") -> Beat:
        """A ConsumerGroupHeartbeat (None: unchanged since the member's previous one)."""
        held = await self._hold(group)
        if isinstance(held, ErrorCode):
            return Beat(held)
        async with held.lock:
            if held.kind == CLASSIC and self._classic_members(group):
                refused = self._upgrade(group, held)
                if refused is not None:
                    return Beat(ErrorCode.GROUP_ID_NOT_FOUND, message=refused)
            before = self.consumer.groups.get(group)
            partitions = self._refresh(group)
            beat = self.consumer.heartbeat(
                group, member_id, epoch, self._clock.monotonic(), partitions, topics=topics, regex=regex, owned=owned,
                assignor=assignor, rebalance_timeout_s=rebalance_timeout_s, instance_id=instance_id, rack=rack,
                client_id=client_id, client_host=client_host)
            if before is None and beat.error:   # a refused first call creates no group
                self.consumer.groups.pop(group, None)
                self.consumer.changed.discard(group)
                return beat
            if held.kind != CONSUMER:
                held.kind = CONSUMER
                self.classic.groups.pop(group, None)
                self.consumer.changed.add(group)
            self._downgrade(group, held)
            error = await self._persist(group, held)
        return Beat(error) if error else beat

    def _upgrade(self, group: str, held: Held) -> str | None:
        """The classic group, which has members, made a consumer group (a consumer-protocol
        member joins it); why not, if the policy or its members' protocol does not allow it."""
        if not self.policy.upgrades:
            return f"{group!r} is a classic group with members (migration policy {self.policy.value!r})"
        try:
            cg = migration.to_consumer(self.classic.groups[group], self._clock.monotonic())
        except ProtocolError as e:
            return f"{group!r} is a classic group that cannot become a consumer group: {e}"
        self._deliver(group, self.classic.release(group))
        self.consumer.groups[group] = cg
        self.consumer.changed.add(group)
        held.kind = CONSUMER
        log.info("group %r: a classic group of %d members becomes a consumer group", group, len(cg.members))
        return None

    def _downgrade(self, group: str, held: Held) -> None:
        """The consumer group made a classic one again if only classic members are left in it."""
        cg = self.consumer.groups.get(group)
        if (held.kind != CONSUMER or cg is None or not cg.members or not self.policy.downgrades
                or any(m.classic is None for m in cg.members.values())):
            return
        self.classic.adopt(migration.to_classic(cg, self._clock.monotonic()), self._clock.monotonic())
        del self.consumer.groups[group]
        self.consumer.changed.discard(group)
        held.kind = CLASSIC
        log.info("group %r: only classic members left, a classic group again", group)

    def _refresh(self, group: str) -> Mapping[str, int]:
        """The cluster's partitions, and a new target for the consumer group if they changed."""
        partitions = self._partitions()
        if self._seen.get(group) != partitions:
            self.consumer.refresh(group, partitions)
            self._seen[group] = partitions
        return partitions

    # --- classic groups ----------------------------------------------------------------------

    async def join(self, group: str, member_id: str, *, protocol_type: str, protocols: Protocols,
                   session_timeout_s: float, rebalance_timeout_s: float, client_id: str, client_host: str,
                   instance_id: str | None, require_known_member: bool) -> JoinAnswer:
        held = await self._hold(group)
        if isinstance(held, ErrorCode):
            return JoinAnswer(held, member_id=member_id)
        async with held.lock:
            if held.kind == CONSUMER and self._consumer_members(group):
                joined = self._join_consumer_group(
                    group, member_id, protocol_type, protocols, session_timeout_s, rebalance_timeout_s, client_id,
                    client_host, instance_id, require_known_member)
                error = await self._persist(group, held)
                return JoinAnswer(error, member_id=member_id) if error else joined
            answer, due = self.classic.join(
                group, member_id, self._clock.monotonic(), protocol_type=protocol_type, protocols=protocols,
                session_timeout_s=session_timeout_s, rebalance_timeout_s=rebalance_timeout_s, client_id=client_id,
                client_host=client_host, instance_id=instance_id, require_known_member=require_known_member)
            waiting = self._wait(group, answer) if isinstance(answer, str) else None
            if held.kind != CLASSIC:
                held.kind = CLASSIC
                self.consumer.groups.pop(group, None)
                self.classic.changed.add(group)
            error = await self._persist(group, held)
            self._deliver(group, due)
        if error:
            return JoinAnswer(error, member_id=member_id)
        if waiting is None:
            assert isinstance(answer, JoinAnswer)
            return answer
        result = await waiting
        assert isinstance(result, JoinAnswer)
        return result

    def _join_consumer_group(self, group: str, member_id: str, protocol_type: str, protocols: Protocols,
                             session_timeout_s: float, rebalance_timeout_s: float, client_id: str, client_host: str,
                             instance_id: str | None, require_known_member: bool) -> JoinAnswer:
        """A classic member's JoinGroup to a consumer group: answered at once, as a follower (no
        leader assigns: the group's assignor does)."""
        if protocol_type != "consumer" or not protocols:
            return JoinAnswer(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id)
        try:
            sub = embedded.subscription(protocols[0][1])
        except ProtocolError:
            return JoinAnswer(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id)
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if require_known_member:   # v4+: it joins again with this id
                return JoinAnswer(ErrorCode.MEMBER_ID_REQUIRED, member_id=member_id)
        beat = self.consumer.classic_join(
            group, member_id, self._clock.monotonic(), self._refresh(group), topics=sub.topics, owned=sub.owned,
            protocols=protocols, session_timeout_s=session_timeout_s, rebalance_timeout_s=rebalance_timeout_s,
            instance_id=instance_id, rack=sub.rack, client_id=client_id, client_host=client_host)
        if beat.error:
            return JoinAnswer(beat.error, member_id=member_id)
        return JoinAnswer(ErrorCode.NONE, beat.epoch, protocols[0][0], "", beat.member_id, (), "consumer")

    async def sync(self, group: str, member_id: str, generation: int, assignments: Sequence[tuple[str, bytes]]
                   ) -> SyncAnswer:
        held = await self._hold(group)
        if isinstance(held, ErrorCode):
            return SyncAnswer(held)
        async with held.lock:
            if held.kind == CONSUMER and group in self.consumer.groups:
                return await self._sync_consumer_group(group, held, member_id, generation)
            answer, due = self.classic.sync(group, member_id, generation, self._clock.monotonic(), assignments)
            waiting = self._wait(group, member_id) if answer is None else None
            error = await self._persist(group, held)
            self._deliver(group, due)
        if error:
            return SyncAnswer(error)
        if waiting is None:
            assert answer is not None
            return answer
        result = await waiting
        assert isinstance(result, SyncAnswer)
        return result

    async def _sync_consumer_group(self, group: str, held: Held, member_id: str, generation: int) -> SyncAnswer:
        """A classic member's SyncGroup in a consumer group: its assignment in its embedded
        protocol's version."""
        error, tps = self.consumer.classic_sync(group, member_id, generation, self._clock.monotonic())
        stored = await self._persist(group, held)
        if error or stored:
            return SyncAnswer(stored or error)
        c = self.consumer.groups[group].members[member_id].classic
        assert c is not None
        name, metadata = c.protocols[0]
        return SyncAnswer(ErrorCode.NONE, embedded.assignment(tps, embedded.version(metadata)), name, "consumer")

    async def classic_heartbeat(self, group: str, member_id: str, generation: int) -> ErrorCode:
        held = await self._hold(group)
        if isinstance(held, ErrorCode):
            return held
        async with held.lock:
            if held.kind == CONSUMER and group in self.consumer.groups:
                error = self.consumer.classic_heartbeat(group, member_id, generation, self._clock.monotonic())
                return await self._persist(group, held) or error
            error, due = self.classic.heartbeat(group, member_id, generation, self._clock.monotonic())
            stored = await self._persist(group, held)
            self._deliver(group, due)
        return stored or error

    async def disconnected(self, members: Iterable[tuple[str, str]]) -> None:
        """The connection these (group, member id)s spoke on closed. A member that speaks again
        within `disconnect_grace_ms` (on a new connection) keeps its place; one that does not (its
        process killed) leaves then, so its partitions move in seconds instead of a session."""
        grace = self.config.disconnect_grace_ms / 1000
        for group, member_id in members if grace > 0 else ():
            held = self._held.get(group)
            if held is None:
                continue
            async with held.lock:
                now = self._clock.monotonic()
                self.consumer.cut_session(group, member_id, now, grace)
                self.classic.cut_session(group, member_id, now, grace)

    async def leave(self, group: str, member_ids: Sequence[str]) -> tuple[ErrorCode, list[ErrorCode]]:
        held = await self._hold(group)
        if isinstance(held, ErrorCode):
            return held, []
        async with held.lock:
            if held.kind == CONSUMER and group in self.consumer.groups:
                errors = self.consumer.classic_leave(group, list(member_ids))
                self._downgrade(group, held)
                return await self._persist(group, held) or ErrorCode.NONE, errors
            errors, due = self.classic.leave(group, member_ids, self._clock.monotonic())
            stored = await self._persist(group, held)
            self._deliver(group, due)
        return stored or ErrorCode.NONE, errors

    # --- offsets -----------------------------------------------------------------------------

    async def commit(self, group: str, member_id: str, generation: int, offsets: Offsets) -> ErrorCode:
        """An OffsetCommit: by a member at its epoch or generation, or by no member (-1) while
        the group has none. Stored before it is answered."""
        held = await self._hold(group)
        if isinstance(held, ErrorCode):
            return held
        async with held.lock:
            if held.kind == CONSUMER:
                error = self.consumer.commit_error(group, member_id, generation)
            elif held.kind == CLASSIC:
                error = self.classic.commit_error(group, member_id, generation)
            else:
                error = ErrorCode.NONE if generation < 0 else ErrorCode.UNKNOWN_MEMBER_ID
            if error or not offsets:
                return error or ErrorCode.NONE
            return await self._store_offsets(group, held, offsets)

    async def txn_commit_error(self, group: str, member_id: str, generation: int) -> ErrorCode:
        """Why a TxnOffsetCommit of `group`'s offsets by `member_id` at `generation` (its member
        epoch in a consumer group) is refused, checked when it arrives as Kafka does: a zombie
        member's is ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID; NOT_COORDINATOR elsewhere."""
        held = await self._hold(group)
        if isinstance(held, ErrorCode):
            return held
        async with held.lock:
            if held.kind == CONSUMER and group in self.consumer.groups:
                return self.consumer.txn_commit_error(group, member_id, generation)
            if held.kind == CLASSIC and group in self.classic.groups:
                return self.classic.txn_commit_error(group, member_id, generation)
            return ErrorCode.NONE if generation < 0 else ErrorCode.ILLEGAL_GENERATION

    async def fetch_error(self, group: str, member_id: str | None, epoch: int) -> ErrorCode:
        """Why an OffsetFetch v9+ by `member_id` at `epoch` is refused (STALE_MEMBER_EPOCH,
        UNKNOWN_MEMBER_ID: a consumer group's member checked as Kafka does; a classic group's
        fetches are not)."""
        held = await self._hold(group)
        if isinstance(held, ErrorCode):
            return held
        if held.kind == CONSUMER and group in self.consumer.groups:
            return self.consumer.fetch_error(group, member_id, epoch)
        return ErrorCode.NONE

    async def offsets(self, group: str) -> Offsets | ErrorCode:
        """The group's committed offsets (an OffsetFetch), as stored: a transaction's commit,
        made by its own coordinator, is there too."""
        held = await self._hold(group)
        if isinstance(held, ErrorCode):
            return held
        try:
            return await asyncio.to_thread(self._store.offsets, group)
        except MemqError as e:
            log.warning("group %r: offsets not read: %s", group, e)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE

    async def commit_transaction(self, group: str, offsets: Offsets) -> None:
        """A committed transaction's offsets of `group`, from the transaction's coordinator
        (any broker: the transaction's state decided it, no group version is checked)."""
        await asyncio.to_thread(self._store.commit, group, None, offsets)

    async def delete_offsets(self, group: str, tps: Sequence[tuple[str, int]]) -> ErrorCode:
        """An OffsetDelete: only of topics no member subscribes to (GROUP_SUBSCRIBED_TO_TOPIC)."""
        held = await self._hold(group)
        if isinstance(held, ErrorCode):
            return held
        async with held.lock:
            if any(t in self._subscribed(group) for t, _ in tps):
                return ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
            return await self._store_offsets(group, held, {tp: (-1, "") for tp in tps})

    async def delete(self, group: str) -> ErrorCode:
        """A DeleteGroups of one group: NON_EMPTY_GROUP while it has members."""
        held = await self._hold(group)
        if isinstance(held, ErrorCode):
            return held
        async with held.lock:
            if self._consumer_members(group) or self._classic_members(group):
                return ErrorCode.NON_EMPTY_GROUP
            try:
                if held.kind is None and not await asyncio.to_thread(self._store.offsets, group):
                    return ErrorCode.GROUP_ID_NOT_FOUND
                await asyncio.to_thread(self._store.delete, group, held.version)
            except StateFencedError:
                self._forget(group)
                return ErrorCode.NOT_COORDINATOR
            except MemqError as e:
                log.warning("group %r: not deleted: %s", group, e)
                return ErrorCode.COORDINATOR_NOT_AVAILABLE
            self._forget(group)
        return ErrorCode.NONE

    # --- describing --------------------------------------------------------------------------

    async def describe(self, group: str) -> Description:
        held = await self._hold(group)
        if isinstance(held, ErrorCode):
            return Description(group, held)
        cg = self.consumer.groups.get(group)
        if held.kind == CONSUMER and cg is not None:
            members = tuple(Member(m.member_id, m.client_id, m.client_host, m.instance_id, m.epoch, m.rack, m.topics,
                                   m.regex, m.assigned, cg.target.get(k, frozenset()))
                            for k, m in cg.members.items())
            return Description(group, ErrorCode.NONE, CONSUMER, cg.state(), "consumer", "", cg.epoch,
                               cg.assignment_epoch, cg.assignor(), members)
        kg = self.classic.groups.get(group)
        if held.kind == CLASSIC and kg is not None:
            members = tuple(Member(m.member_id, m.client_id, m.client_host, m.instance_id,
                                   metadata=dict(m.protocols).get(kg.protocol or "", b""), assignment=m.assignment)
                            for m in kg.members.values())
            return Description(group, ErrorCode.NONE, CLASSIC, kg.state, kg.protocol_type, kg.protocol or "",
                               kg.generation, members=members)
        return Description(group, ErrorCode.NONE, held.kind or CLASSIC, "Empty")

    async def listed(self) -> list[tuple[str, str, str]]:
        """(group, kind, state) of every stored group this broker coordinates."""
        meta = self._metadata()
        stored = await asyncio.to_thread(self._store.groups)
        out = []
        for group, kind in sorted(stored.items()):
            if not_coordinator(meta, group, self.broker_id) is not None:
                continue
            cg, kg = self.consumer.groups.get(group), self.classic.groups.get(group)
            state = cg.state() if kind == CONSUMER and cg else kg.state if kind == CLASSIC and kg else "Empty"
            out.append((group, kind or CLASSIC, state))
        return out

    # --- the group's lifecycle here ----------------------------------------------------------

    async def _hold(self, group: str) -> Held | ErrorCode:
        """The group, claimed from the store on first use; NOT_COORDINATOR (or
        COORDINATOR_NOT_AVAILABLE) when it is not this broker's."""
        error = not_coordinator(self._metadata(), group, self.broker_id)
        if error is not None:
            if group in self._held:
                self._forget(group)
            return error
        held = self._held.get(group)
        if held is not None:
            return held
        claiming = self._claiming.get(group)
        if claiming is None:   # one claim per group, however many calls wait for it
            claiming = self._claiming[group] = asyncio.ensure_future(self._claim(group))
            claiming.add_done_callback(lambda _: self._claiming.pop(group, None))
        try:
            return await asyncio.shield(claiming)
        except MemqError as e:
            log.warning("group %r: not loaded: %s", group, e)
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS

    async def _claim(self, group: str) -> Held:
        taken: Offsets = {}   # read before the claim: a failed read leaves the group unknown, tried again
        if self._legacy is not None and not await asyncio.to_thread(self._store.known, group):
            taken = await self._legacy(group)
        loaded = await asyncio.to_thread(self._store.claim, group, self.broker_id)
        now = self._clock.monotonic()
        held = Held(loaded.kind, loaded.version)
        if loaded.kind == CONSUMER and loaded.state:
            self.consumer.groups[group] = consumer.restore(group, loaded.state, now)
        elif loaded.kind == CLASSIC and loaded.state:
            self.classic.groups[group] = classic.restore(group, loaded.state, now)
        if taken and loaded.kind is None and not await asyncio.to_thread(self._store.offsets, group):
            await asyncio.to_thread(self._store.commit, group, held.version, taken)
            log.info("group %r: took over %d offsets committed through the relay", group, len(taken))
        log.info("group %r: coordinated here (store version %d)", group, held.version)
        self._held[group] = held
        return held

    async def _persist(self, group: str, held: Held) -> ErrorCode | None:
        """Write the group's state if a call changed it; an error code when it is not ours any more."""
        cg_changed = group in self.consumer.changed
        kg_changed = group in self.classic.changed
        self.consumer.changed.discard(group)
        self.classic.changed.discard(group)
        if not (cg_changed or kg_changed) or held.kind is None:
            return None
        cg, kg = self.consumer.groups.get(group), self.classic.groups.get(group)
        if held.kind == CONSUMER and cg is not None:
            state = consumer.snapshot(cg)
        elif held.kind == CLASSIC and kg is not None:
            state = classic.snapshot(kg)
        else:
            return None
        try:
            held.version = await asyncio.to_thread(self._store.write, group, self.broker_id, held.kind, state,
                                                   held.version)
        except StateFencedError:
            self._forget(group)
            return ErrorCode.NOT_COORDINATOR
        except MemqError as e:
            log.warning("group %r: state not written: %s", group, e)
            self._forget(group)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return None

    async def _store_offsets(self, group: str, held: Held, offsets: Offsets) -> ErrorCode:
        """`offsets` stored (-1: deleted), if the group is still this broker's."""
        try:
            await asyncio.to_thread(self._store.commit, group, held.version, offsets)
        except StateFencedError:
            self._forget(group)
            return ErrorCode.NOT_COORDINATOR
        except MemqError as e:
            log.warning("group %r: offsets not stored: %s", group, e)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return ErrorCode.NONE

    def _forget(self, group: str) -> None:
        log.info("group %r: no longer coordinated here", group)
        self._held.pop(group, None)
        self._seen.pop(group, None)
        self.consumer.groups.pop(group, None)
        self.classic.groups.pop(group, None)
        for key in [k for k in self._waiting if k[0] == group]:
            fut = self._waiting.pop(key)
            if not fut.done():
                fut.set_result(JoinAnswer(ErrorCode.NOT_COORDINATOR, member_id=key[1]))

    def _wait(self, group: str, member_id: str) -> asyncio.Future[JoinAnswer | SyncAnswer]:
        old = self._waiting.pop((group, member_id), None)
        if old is not None and not old.done():   # a second call of the same member replaces the first
            old.set_result(JoinAnswer(ErrorCode.REBALANCE_IN_PROGRESS, member_id=member_id))
        fut: asyncio.Future[JoinAnswer | SyncAnswer] = asyncio.get_running_loop().create_future()
        self._waiting[(group, member_id)] = fut
        return fut

    def _deliver(self, group: str, due: list[Answer]) -> None:
        for a in due:
            fut = self._waiting.pop((group, a.member_id), None)
            if fut is not None and not fut.done():
                fut.set_result(a.answer)

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick_ms / 1000)
            for group, held in list(self._held.items()):
                try:
                    async with held.lock:
                        if self._held.get(group) is not held:
                            continue
                        now = self._clock.monotonic()
                        due = self.classic.tick(group, now)
                        if self.consumer.expire(group, now):
                            self._downgrade(group, held)
                        error = await self._persist(group, held)
                        self._deliver(group, due)
                    if error:
                        log.info("group %r: fenced while expiring members", group)
                except Exception:   # the ticker must outlive a bad group
                    log.exception("group %r: timeouts not checked", group)

    def _partitions(self) -> Mapping[str, int]:
        return {name: t.read_partitions for name, t in self._metadata().topics.items()}

    def _consumer_members(self, group: str) -> int:
        g = self.consumer.groups.get(group)
        return len(g.members) if g else 0

    def _classic_members(self, group: str) -> int:
        g = self.classic.groups.get(group)
        return len(g.members) if g else 0

    def _subscribed(self, group: str) -> set[str]:
        cg = self.consumer.groups.get(group)
        partitions = self._partitions()
        return {t for m in cg.members.values() for t in m.subscribed(partitions)} if cg else set()
