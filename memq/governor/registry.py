"""The cluster registry in ZooKeeper (kazoo): brokers, topics, assignments, drain flags.

Layout under `<zookeeper.root>/<cluster>`:
  brokers/<id>       ephemeral, JSON BrokerInfo (+ "unhealthy": why, while it cannot serve
                     ack=all writes): gone when the broker's session ends
  topics/<name>      persistent, JSON TopicConfig
  assignments/<name> persistent, JSON {"brokers": [ids]}, written only by the governor
  drain/<id>         persistent flag: the governor moves every topic off that broker
  log_starts/<name>  persistent, JSON {"partitions": {"<p>": Kafka offset}}: where DeleteRecords
                     moved each partition's log start (only ever forward; gone with the topic)
  governor/          kazoo Lock: its first contender is the governor

Every call has a timeout (`ZooKeeperConfig.connect_timeout_s`) and kazoo failures become
`CoordinationError`s naming the path, so callers never hang on a lost connection.

Brokers, topics, assignments and drain flags are read through a `ZnodeCache`: each znode is
read (and parsed) once per change its watch reports, not on every cycle, and this registry's
own writes are visible to its next read at once. A `watch` passed to a read subscribes to
every change of what the cache holds (cycles re-read everything through the cache anyway).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (BadVersionError, KazooException, NodeExistsError,
                              NoNodeError, RolledBackError)
from kazoo.protocol.states import EventType, KazooState, WatchedEvent

from memq.config import UNSTATED_OFFSETS, TopicConfig, ZooKeeperConfig, build
from memq.errors import ConfigError, CoordinationError, LeadershipLostError, UnknownTopicError
from memq.kafka_api.dense import Checkpoint, decode_checkpoints, encode_checkpoints, kept

from .assignment import BrokerInfo
from .znode_cache import ZnodeCache

log = logging.getLogger(__name__)

Watch = Callable[[WatchedEvent], None]
T = TypeVar("T")


@dataclass(frozen=True)
class ClusterState:
    """One consistent-enough read of the registry (each znode read once)."""

    brokers: dict[str, BrokerInfo]
    topics: dict[str, TopicConfig]
    assignments: dict[str, tuple[str, ...]]
    unhealthy: dict[str, str] = field(default_factory=dict)   # broker id -> why it cannot serve
    log_starts: dict[str, dict[int, int]] = field(default_factory=dict)   # topic -> partition -> Kafka offset

    def topic_urls(self, topic: str) -> list[str]:
        """URLs of the live brokers assigned `topic`, in assignment order."""
        return [self.brokers[b].url for b in self.assignments.get(topic, ()) if b in self.brokers]


def topic_to_json(cfg: TopicConfig) -> bytes:
    return json.dumps(dataclasses.asdict(cfg), sort_keys=True).encode()


def topic_from_json(data: bytes, where: str) -> TopicConfig:
    try:
        values = json.loads(data)
    except ValueError as e:
        raise CoordinationError(f"{where}: topic config is not JSON: {e}") from None
    if not isinstance(values, dict):
        raise CoordinationError(f"{where}: topic config must be a JSON object")
    values.setdefault("offsets", UNSTATED_OFFSETS)   # stored before dense offsets: it keeps its sparse ones
    try:
        cfg: TopicConfig = build(TopicConfig, values, where)
    except ConfigError as e:
        raise CoordinationError(str(e)) from None
    return cfg


def log_starts_from_json(data: bytes, where: str) -> dict[int, int]:
    """A topic's log starts znode: {partition: Kafka offset}."""
    try:
        parts = json.loads(data)["partitions"]
        out = {int(p): int(o) for p, o in parts.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CoordinationError(f"{where}: log starts are not {{\"partitions\": {{p: offset}}}}: {e}") from None
    if any(p < 0 or o < 0 for p, o in out.items()):
        raise CoordinationError(f"{where}: a negative partition or offset in {out}")
    return out


def log_starts_to_json(starts: dict[int, int]) -> bytes:
    return json.dumps({"partitions": {str(p): o for p, o in sorted(starts.items())}}).encode()


def claim_node(zk: KazooClient, path: str, mark: Callable[[bytes], bytes]) -> tuple[bytes, int]:
    """Take the znode at `path` (made empty if missing) for a new owner: write `mark(its data)` at
    the version read, so the previous owner's next versioned write fails (its fencing); a lost race
    is read again. (The data before the mark, the version after it.)"""
    while True:
        try:
            raw, stat = zk.get(path)
        except NoNodeError:
            try:
                zk.create(path, b"", makepath=True)
            except NodeExistsError:
                pass
            continue
        try:
            return raw, int(zk.set(path, mark(raw), version=stat.version).version)
        except BadVersionError:
            continue


class Registry:
    """A kazoo client bound to one cluster's subtree; thread-safe like kazoo itself."""

    def __init__(self, zk: ZooKeeperConfig, cluster: str) -> None:
        self.zk = zk
        self.base = f"{zk.root.rstrip('/')}/{cluster}"
        self.timeout_s = zk.connect_timeout_s
        self.client = KazooClient(hosts=zk.hosts, timeout=zk.session_timeout_s,
                                  connection_retry={"max_tries": -1, "max_delay": 1.0},
                                  command_retry={"max_tries": 3, "max_delay": 1.0})
        self.cache = ZnodeCache()
        self._subscribers: set[Watch] = set()
        self.client.add_listener(self._on_state)

    # --- paths ---------------------------------------------------------------------------
    @property
    def brokers_path(self) -> str:
        return f"{self.base}/brokers"

    @property
    def topics_path(self) -> str:
        return f"{self.base}/topics"

    @property
    def assignments_path(self) -> str:
        return f"{self.base}/assignments"

    @property
    def drain_path(self) -> str:
        return f"{self.base}/drain"

    @property
    def log_starts_path(self) -> str:
        return f"{self.base}/log_starts"

    @property
    def offset_bases_path(self) -> str:
        return f"{self.base}/offset_bases"

    @property
    def election_path(self) -> str:
        return f"{self.base}/governor"

    # --- lifecycle -----------------------------------------------------------------------
    def start(self) -> Registry:
        try:
            self.client.start(timeout=self.timeout_s)
        except self.client.handler.timeout_exception:
            self.client.stop()
            raise CoordinationError(f"ZooKeeper {self.zk.hosts}: no connection within "
                                    f"{self.timeout_s:g}s (zookeeper.connect_timeout_s)") from None
        for path in (self.brokers_path, self.topics_path, self.assignments_path,
                     self.drain_path, self.log_starts_path, self.election_path):
            self._wait(self.client.ensure_path_async(path), path)
        return self

    def close(self) -> None:
        self.client.stop()
        self.client.close()

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_listener(self, fn: Callable[[KazooState], None]) -> None:
        self.client.add_listener(fn)

    @property
    def session_id(self) -> int | None:
        """The ZooKeeper session's id (a new one after expiry), None before the first connect."""
        client_id = self.client.client_id
        return client_id[0] if client_id else None

    @property
    def connected(self) -> bool:
        return self.client.state == KazooState.CONNECTED

    def _wait(self, async_result: Any, what: str) -> Any:
        """Wait for a kazoo async call with the timeout; kazoo errors -> CoordinationError."""
        try:
            return async_result.get(timeout=self.timeout_s)
        except self.client.handler.timeout_exception:
            raise CoordinationError(f"ZooKeeper {what}: no answer within {self.timeout_s:g}s") from None
        except (NoNodeError, NodeExistsError, BadVersionError, RolledBackError):
            raise
        except KazooException as e:
            raise CoordinationError(f"ZooKeeper {what}: {type(e).__name__} {e}") from None

    def _children(self, path: str) -> list[str]:
        """Children of `path`, read now (uncached: for a write that must see the latest)."""
        return sorted(self._wait(self.client.get_children_async(path), path))

    def _get(self, path: str) -> bytes | None:
        try:
            data, _ = self._wait(self.client.get_async(path), path)
        except NoNodeError:
            return None
        return bytes(data or b"")

    # --- cached reads ----------------------------------------------------------------------
    def _subscribe(self, watch: Watch | None) -> None:
        if watch is not None:
            self._subscribers.add(watch)

    def _cached_children(self, path: str) -> list[str]:
        return list(self.cache.get(("children", path), lambda: tuple(sorted(
            self._wait(self.client.get_children_async(path, watch=self._on_event), path)))))

    def _cached_data(self, path: str, decode: Callable[[bytes], T]) -> T | None:
        """The decoded znode, None if it does not exist (not cached: a missing znode has no watch)."""
        def load() -> T:
            data, _ = self._wait(self.client.get_async(path, watch=self._on_event), path)
            return decode(bytes(data or b""))
        try:
            return self.cache.get(("data", path), load)
        except NoNodeError:
            return None

    def _on_event(self, event: WatchedEvent) -> None:
        """kazoo's watch callback: forget what changed, then tell the subscribers."""
        if event.type in (EventType.CHILD, EventType.DELETED):
            self.cache.invalidate(("children", event.path))
        if event.type != EventType.CHILD:
            self.cache.invalidate(("data", event.path))
        for watch in list(self._subscribers):
            watch(event)

    def _on_state(self, state: KazooState) -> None:
        if state != KazooState.CONNECTED:
            self.cache.clear()   # watches may not survive: read everything again once back

    def _wrote(self, path: str) -> None:
        """After a write of ours: our next read must see it, before its watch event arrives."""
        self.cache.invalidate(("data", path))
        self.cache.invalidate(("children", path.rsplit("/", 1)[0]))

    # --- brokers -------------------------------------------------------------------------
    @staticmethod
    def _broker_json(info: BrokerInfo, unhealthy: str | None) -> bytes:
        d: dict[str, Any] = {"id": info.id, "url": info.url, "rack": info.rack, "capacity_mbps": info.capacity_mbps,
                             "max_frame_bytes": info.max_frame_bytes, "kafka_address": info.kafka_address}
        if unhealthy:
            d["unhealthy"] = unhealthy
        return json.dumps(d).encode()

    def set_broker_health(self, info: BrokerInfo, unhealthy: str | None) -> None:
        """Publish why this (registered) broker cannot serve writes, or that it can again."""
        path = f"{self.brokers_path}/{info.id}"
        try:
            self._wait(self.client.set_async(path, self._broker_json(info, unhealthy)), path)
            self._wrote(path)
        except NoNodeError:
            raise CoordinationError(f"{path}: broker {info.id} is not registered") from None

    def register_broker(self, info: BrokerInfo, unhealthy: str | None = None) -> bool:
        """Create this broker's ephemeral znode; True if it had to be (re)created.

        A znode left by an earlier session (a crashed process of the same id) is replaced.
        """
        path = f"{self.brokers_path}/{info.id}"
        data = self._broker_json(info, unhealthy)
        session_id = self.session_id
        try:
            _, stat = self._wait(self.client.get_async(path), path)
            if stat.ephemeralOwner == session_id:
                return False
            self._wait(self.client.delete_async(path, version=stat.version), path)
        except (NoNodeError, BadVersionError):
            pass
        try:
            self._wait(self.client.create_async(path, data, ephemeral=True), path)
        except NodeExistsError:
            raise CoordinationError(f"{path}: another process registered broker {info.id}") from None
        finally:
            self._wrote(path)
        return True

    def brokers(self, watch: Watch | None = None) -> dict[str, BrokerInfo]:
        """Live brokers, with `draining` set from the drain flags."""
        return self._brokers(watch)[0]

    def _brokers(self, watch: Watch | None) -> tuple[dict[str, BrokerInfo], dict[str, str]]:
        """Live brokers, and why those reporting unhealthy are."""
        self._subscribe(watch)
        drains = set(self._cached_children(self.drain_path))
        out: dict[str, BrokerInfo] = {}
        unhealthy: dict[str, str] = {}
        for bid in self._cached_children(self.brokers_path):
            try:
                d = self._cached_data(f"{self.brokers_path}/{bid}", json.loads)   # watched: health changes
                if d is None:
                    continue  # went away between list and read
                out[bid] = BrokerInfo(bid, d["url"], d.get("rack", ""), float(d["capacity_mbps"]),
                                      draining=bid in drains, max_frame_bytes=int(d.get("max_frame_bytes", 0)),
                                      kafka_address=str(d.get("kafka_address", "")))
            except (ValueError, KeyError, TypeError, ConfigError) as e:
                log.error("ignoring broker znode %s/%s: %s", self.brokers_path, bid, e)
                continue
            if d.get("unhealthy"):
                unhealthy[bid] = str(d["unhealthy"])
        return out, unhealthy

    def set_drain(self, broker_id: str, on: bool = True) -> None:
        """Ask the governor to move every topic off `broker_id` (or stop asking)."""
        path = f"{self.drain_path}/{broker_id}"
        try:
            if on:
                self._wait(self.client.create_async(path, b""), path)
            else:
                self._wait(self.client.delete_async(path), path)
        except (NodeExistsError, NoNodeError):
            pass
        self._wrote(path)

    def drains(self) -> set[str]:
        return set(self._cached_children(self.drain_path))

    # --- topics --------------------------------------------------------------------------
    def create_topic(self, cfg: TopicConfig) -> None:
        path = f"{self.topics_path}/{cfg.name}"
        try:
            self._wait(self.client.create_async(path, topic_to_json(cfg)), path)
        except NodeExistsError:
            raise CoordinationError(f"topic {cfg.name} already exists") from None
        self._wrote(path)

    def alter_topic(self, cfg: TopicConfig) -> None:
        path = f"{self.topics_path}/{cfg.name}"
        try:
            self._wait(self.client.set_async(path, topic_to_json(cfg)), path)
        except NoNodeError:
            raise UnknownTopicError(f"topic {cfg.name} does not exist") from None
        self._wrote(path)

    def delete_topic(self, name: str) -> None:
        """Delete the topic and its log starts (a topic created again under the name starts at
        offset 0); the governor then drops its assignment and brokers stop it."""
        path = f"{self.topics_path}/{name}"
        try:
            self._wait(self.client.delete_async(path), path)
        except NoNodeError:
            raise UnknownTopicError(f"topic {name} does not exist") from None
        self._wrote(path)
        starts = f"{self.log_starts_path}/{name}"
        try:
            self._wait(self.client.delete_async(starts), starts)
        except NoNodeError:
            pass
        self._wrote(starts)
        bases = f"{self.offset_bases_path}/{name}"
        try:
            self.client.delete(bases, recursive=True)
        except NoNodeError:
            pass
        except KazooException as e:
            raise CoordinationError(f"ZooKeeper {bases}: {type(e).__name__} {e}") from None

    def offset_checkpoints(self, topic: str, partition: int) -> tuple[Checkpoint, ...]:
        """A dense topic's partition's stored checkpoints (`memq.kafka_api.dense`), oldest first."""
        return decode_checkpoints(self._get(f"{self.offset_bases_path}/{topic}/{partition}") or b"")

    def save_offset_checkpoint(self, topic: str, partition: int, new: Checkpoint, low: int) -> None:
        """Add `new` to the partition's checkpoints (`dense.kept`: what retention at `low` still
        needs). Every reader computes the same checkpoints, so a write lost to a concurrent one
        (compare-and-set on the znode's version) is left lost: the next one comes soon."""
        path = f"{self.offset_bases_path}/{topic}/{partition}"
        try:
            data, stat = self._wait(self.client.get_async(path), path)
        except NoNodeError:
            data, stat = b"", None
        points = kept(decode_checkpoints(bytes(data or b"")), new, low)
        try:
            if stat is None:
                self._wait(self.client.create_async(path, encode_checkpoints(points), makepath=True), path)
            else:
                self._wait(self.client.set_async(path, encode_checkpoints(points), version=stat.version), path)
        except (NodeExistsError, BadVersionError):
            log.info("offset checkpoint %s of %s: written by another reader meanwhile", new, path)

    def topic(self, name: str) -> TopicConfig:
        path = f"{self.topics_path}/{name}"
        data = self._get(path)
        if data is None:
            raise UnknownTopicError(f"topic {name} does not exist")
        return topic_from_json(data, path)

    def topics(self, watch: Watch | None = None) -> dict[str, TopicConfig]:
        self._subscribe(watch)
        out: dict[str, TopicConfig] = {}
        for name in self._cached_children(self.topics_path):
            path = f"{self.topics_path}/{name}"
            try:
                cfg = self._cached_data(path, functools.partial(topic_from_json, where=path))
            except CoordinationError as e:
                log.error("ignoring %s", e)
                continue
            if cfg is not None:
                out[name] = cfg
        return out

    # --- log starts (DeleteRecords) ---------------------------------------------------------
    def log_starts(self, watch: Watch | None = None) -> dict[str, dict[int, int]]:
        """Per topic, the partitions whose log start DeleteRecords moved: {partition: Kafka offset}."""
        self._subscribe(watch)
        out: dict[str, dict[int, int]] = {}
        for name in self._cached_children(self.log_starts_path):
            path = f"{self.log_starts_path}/{name}"
            try:
                starts = self._cached_data(path, functools.partial(log_starts_from_json, where=path))
            except CoordinationError as e:
                log.error("ignoring %s", e)
                continue
            if starts:
                out[name] = starts
        return out

    def move_log_starts(self, topic: str, wanted: dict[int, int]) -> dict[int, int]:
        """Move `topic`'s log starts forward to `wanted` (a partition's start never goes back);
        all of its partitions' starts after the move. A compare-and-set on the znode's version,
        so concurrent moves from several brokers all land."""
        path = f"{self.log_starts_path}/{topic}"
        for _ in range(10):
            try:
                data, stat = self._wait(self.client.get_async(path), path)
            except NoNodeError:
                merged = dict(wanted)
                try:
                    self._wait(self.client.create_async(path, log_starts_to_json(merged)), path)
                except NodeExistsError:
                    continue
                self._wrote(path)
                return merged
            current = log_starts_from_json(bytes(data or b""), path)
            merged = current | {p: max(o, current.get(p, 0)) for p, o in wanted.items()}
            if merged == current:
                return current
            try:
                self._wait(self.client.set_async(path, log_starts_to_json(merged), version=stat.version), path)
            except (BadVersionError, NoNodeError):
                continue
            self._wrote(path)
            return merged
        raise CoordinationError(f"{path}: log starts changed under 10 attempts to move them; try again")

    # --- assignments ---------------------------------------------------------------------
    def assignments(self, watch: Watch | None = None) -> dict[str, tuple[str, ...]]:
        self._subscribe(watch)
        out: dict[str, tuple[str, ...]] = {}
        for name in self._cached_children(self.assignments_path):
            path = f"{self.assignments_path}/{name}"
            try:
                brokers = self._cached_data(path, lambda data: tuple(str(b) for b in json.loads(data)["brokers"]))
            except (ValueError, KeyError, TypeError) as e:
                log.error("ignoring assignment %s: %s", path, e)
                continue
            if brokers is not None:
                out[name] = brokers
        return out

    def write_assignments(self, changes: dict[str, tuple[str, ...] | None], *,
                          fence: str | None = None) -> None:
        """Apply assignment changes (None deletes) in one transaction.

        `fence` is the governor's lock znode: if it is gone (the session that won the
        election ended), the transaction fails and nothing is written.
        """
        if not changes:
            return
        existing = set(self._children(self.assignments_path))
        tx = self.client.transaction()
        if fence is not None:
            tx.check(fence, 0)  # lock znodes are created once and never written: version 0
        for topic, brokers in sorted(changes.items()):
            path = f"{self.assignments_path}/{topic}"
            if brokers is None:
                if topic in existing:
                    tx.delete(path)
            elif topic in existing:
                tx.set_data(path, json.dumps({"brokers": list(brokers)}).encode())
            else:
                tx.create(path, json.dumps({"brokers": list(brokers)}).encode())
        try:
            results = self._wait(tx.commit_async(), self.assignments_path)
        finally:
            for topic in changes:
                self._wrote(f"{self.assignments_path}/{topic}")
        failed = [r for r in results if isinstance(r, Exception)]
        if fence is not None and isinstance(results[0], NoNodeError):
            raise LeadershipLostError(f"{fence} is gone: this governor lost its election")
        if failed:
            raise CoordinationError(f"assignment write failed: {failed[0]!r}")

    def snapshot(self, watch: Watch | None = None) -> ClusterState:
        brokers, unhealthy = self._brokers(watch)
        return ClusterState(brokers, self.topics(watch), self.assignments(watch), unhealthy, self.log_starts(watch))

    # --- governor ------------------------------------------------------------------------
    def governor(self) -> str | None:
        """Id of the current governor (first contender of the election lock), if any."""
        contenders: Iterable[str] = self.client.Lock(self.election_path).contenders()
        return next(iter(contenders), None)
