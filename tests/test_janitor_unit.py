"""The janitor's pass through its seams (in-memory storage and notification log): leadership,
chunking, refused keys, the audit record. The same pass on real servers: test_janitor.py."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from prometheus_client import CollectorRegistry

from memq.config import GovernorConfig, MemqConfig, TopicConfig
from memq.governor.janitor import Janitor
from memq.notify.log import RETENTION_RECHECK_S, KafkaNotificationLog
from memq.storage.base import DeleteFailure, ObjectInfo, ObjectLocation

from tests.support.clock import FakeClock

NOW = 1_800_000_000_000
DAY = 86_400_000


class MemoryStorage:
    """The janitor's `ObjectStore`: objects in a dict; records every bulk delete request."""

    def __init__(self, objects: Sequence[ObjectInfo], refuse: Collection[str] = ()) -> None:
        self.objects = {o.location.key: o for o in objects}
        self.refuse = refuse
        self.requests: list[int] = []
        self.listed: list[str] = []   # the topics whose own key space was listed, a call per time range

    async def list_topic(self, topic: str, start_ms: int, end_ms: int, *, all_attempts: bool = False) -> list[ObjectInfo]:
        self.listed.append(topic)
        return self._list(f"/topics/{topic}/", start_ms, end_ms)

    async def list_group(self, group: str, start_ms: int, end_ms: int, *, all_attempts: bool = False) -> list[ObjectInfo]:
        return self._list(f"/groups/{group}/", start_ms, end_ms)

    def _list(self, home: str, start_ms: int, end_ms: int) -> list[ObjectInfo]:
        return sorted((o for o in self.objects.values() if home in o.location.key and start_ms <= o.timestamp_ms < end_ms),
                      key=lambda o: o.timestamp_ms)

    async def delete_many(self, locs: Sequence[ObjectLocation]) -> list[DeleteFailure]:
        self.requests.append(len(locs))
        failures = [DeleteFailure(loc, "AccessDenied: no") for loc in locs if loc.key in self.refuse]
        for loc in locs:
            if loc.key not in self.refuse:
                self.objects.pop(loc.key, None)
        return failures

    async def close(self) -> None:
        pass


class NoPointers:
    """The janitor's `NotificationLog`: notification topics with nothing retained, unless `retained` names (per Kafka topic) the
    oldest object time per home its retained notifications point to."""

    def __init__(self, retained: dict[str, dict[str, int]] | None = None) -> None:
        self.retention: dict[str, int] = {}
        self.retained = retained or {}

    def sync_retention(self, kafka_topic: str, retention_ms: int) -> None:
        self.retention[kafka_topic] = retention_ms

    def expire(self, kafka_topic: str, before_ms: int) -> dict[str, int]:
        return self.retained.get(kafka_topic, {})

    def references(self, kafka_topic: str, start_ms: int, end_ms: int) -> set[str]:
        return set()

    def close(self) -> None:
        pass


class Audit:
    """The janitor's `ExpiryAudit`: records what it was told expired."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, int]] = []

    def expired(self, *, topic: str, before_ms: int) -> None:
        self.marks.append((topic, before_ms))

    def close(self) -> None:
        pass


def old_objects(n: int) -> list[ObjectInfo]:
    return [ObjectInfo(ObjectLocation("b", f"{i % 256:02x}/c/topics/t/{NOW - 2 * DAY + i:013d}-b1-{i:x}-a0"), 10,
                       NOW - 2 * DAY + i) for i in range(n)]


def janitor(storage: MemoryStorage, audit: Audit | None = None,
            registry: CollectorRegistry | None = None, notifications: NoPointers | None = None) -> Janitor:
    config = MemqConfig(governor=GovernorConfig(retention_grace_s=60, orphan_grace_s=60))
    return Janitor(config, registry or CollectorRegistry(), storage=storage,
                   notifications=notifications or NoPointers(), audit=audit, clock=FakeClock(wall_s=NOW / 1000))


async def test_expired_objects_go_1000_keys_a_request_and_the_audit_hears_first() -> None:
    storage, audit, pointers = MemoryStorage(old_objects(2_500)), Audit(), NoPointers()
    [report] = await janitor(storage, audit, notifications=pointers).run_once(
        {"t": TopicConfig("t", retention_ms=DAY, storage_group="")})
    assert storage.requests == [1000, 1000, 500] and not storage.objects
    assert len(report.expired) == 2_500 and report.failed == 0
    assert audit.marks == [("t", report.object_ms)] and report.object_ms == NOW - DAY - 60_000
    assert pointers.retention == {"memq.dev.t": DAY}


async def test_a_janitor_that_stops_governing_stops_deleting() -> None:
    storage = MemoryStorage(old_objects(2_500))
    answers = iter([True, True, False])             # the topic, the first request, then lost
    [report] = await janitor(storage).run_once({"t": TopicConfig("t", retention_ms=DAY, storage_group="")}, lambda: next(answers))
    assert storage.requests == [1000] and len(storage.objects) == 1_500
    assert await janitor(storage).run_once({"t": TopicConfig("t", storage_group="")}, lambda: False) == []


async def test_refused_keys_are_reported_counted_and_kept_for_the_next_pass() -> None:
    objs = old_objects(10)
    storage = MemoryStorage(objs, refuse={objs[3].location.key})
    registry = CollectorRegistry()
    [report] = await janitor(storage, registry=registry).run_once({"t": TopicConfig("t", retention_ms=DAY, storage_group="")})
    assert report.failed == 1 and list(storage.objects) == [objs[3].location.key]
    assert registry.get_sample_value("memq_janitor_errors_total", {"topic": "t", "stage": "delete"}) == 1
    assert registry.get_sample_value("memq_janitor_deleted_objects_total",
                                     {"topic": "t", "reason": "expired"}) == 9


def group_object(home: str, ms: int) -> ObjectInfo:
    return ObjectInfo(ObjectLocation("b", f"00/c/{home}/{ms:013d}-b1-1-a0"), 10, ms)


async def test_a_shared_object_goes_only_when_every_member_topics_retention_has_passed() -> None:
    """Group g holds topics a (1 day) and b (3 days): its objects go after 3 days; c, alone in
    its own group, after 1 day; the audit hears of both of g's topics."""
    objs = [group_object("groups/g", NOW - 2 * DAY), group_object("groups/g", NOW - 4 * DAY),
            group_object("groups/solo", NOW - 2 * DAY)]
    storage, audit = MemoryStorage(objs), Audit()
    topics = {"a": TopicConfig("a", retention_ms=DAY, storage_group="g"),
              "b": TopicConfig("b", retention_ms=3 * DAY, storage_group="g"),
              "c": TopicConfig("c", retention_ms=DAY, storage_group="solo")}
    reports = {r.topic: r for r in await janitor(storage, audit).run_once(topics)}
    assert sorted(reports) == ["a", "b", "c", "group:g", "group:solo"]
    assert [o.location for o in reports["group:g"].expired] == [objs[1].location]
    assert [o.location for o in reports["group:solo"].expired] == [objs[2].location]
    assert list(storage.objects) == [objs[0].location.key]
    assert reports["group:g"].object_ms == NOW - 3 * DAY - 60_000
    assert sorted(audit.marks) == [("a", NOW - 3 * DAY - 60_000), ("b", NOW - 3 * DAY - 60_000),
                                   ("c", NOW - DAY - 60_000)]


async def test_a_shared_object_a_retained_notification_names_stays() -> None:
    """Topic a's notifications still name a group object 5 days old (Kafka kept them): it and
    everything newer in the group stay, whatever the retention says."""
    objs = [group_object("groups/g", NOW - 6 * DAY), group_object("groups/g", NOW - 5 * DAY)]
    storage = MemoryStorage(objs)
    pointers = NoPointers({"memq.dev.a": {"groups/g": NOW - 5 * DAY}})
    topics = {"a": TopicConfig("a", retention_ms=DAY, storage_group="g")}
    reports = {r.topic: r for r in await janitor(storage, notifications=pointers).run_once(topics)}
    assert [o.location for o in reports["group:g"].expired] == [objs[0].location]
    assert list(storage.objects) == [objs[1].location.key]


async def test_a_shared_group_topic_s_own_key_space_is_listed_until_found_empty() -> None:
    """Each listing of a topic's own objects is 256 LIST requests: a thousand topics of a shared
    group (whose batches go into group objects) listed every pass cost ~$10k a month. `legacy`
    still has an expired object of its own from before it joined the group: listed until gone."""
    legacy = ObjectInfo(ObjectLocation("b", f"00/c/topics/legacy/{NOW - 2 * DAY:013d}-b1-1-a0"), 10, NOW - 2 * DAY)
    storage = MemoryStorage([legacy])
    topics = {"a": TopicConfig("a", retention_ms=DAY, storage_group="g"),
              "legacy": TopicConfig("legacy", retention_ms=DAY, storage_group="g"),
              "own": TopicConfig("own", retention_ms=DAY, storage_group="")}
    j = janitor(storage)
    await j.run_once(topics)
    assert set(storage.listed) == {"a", "legacy", "own"} and not storage.objects   # legacy's object expired
    storage.listed.clear()
    await j.run_once(topics)
    assert set(storage.listed) == {"legacy", "own"}     # found empty only now
    storage.listed.clear()
    await j.run_once(topics)
    assert set(storage.listed) == {"own"}
    storage.listed.clear()
    topics["a"] = TopicConfig("a", retention_ms=DAY, storage_group="")   # writes its own objects again
    await j.run_once(topics)
    assert set(storage.listed) == {"a", "own"}


class CountingAdmin:
    """A Kafka admin (`RetentionAdmin`) whose topics' retention.ms can be changed behind the janitor's back."""

    def __init__(self) -> None:
        self.retention: dict[str, int] = {}
        self.describes = 0

    def retention_ms(self, name: str) -> int | None:
        self.describes += 1
        return self.retention.get(name)

    def set_retention(self, name: str, retention_ms: int) -> None:
        self.retention[name] = retention_ms

    def delete_records(self, name: str, before: Mapping[int, int]) -> None:
        raise AssertionError("sync_retention deletes no records")


def test_a_notification_topic_s_retention_is_described_once_until_it_changes_or_an_hour_passes() -> None:
    admin, clock = CountingAdmin(), FakeClock()
    log = KafkaNotificationLog(MemqConfig(), timeout_s=5, clock=clock, admin=admin)
    for _ in range(3):                                      # three passes
        log.sync_retention("memq.dev.t", 60_000)
    assert (admin.describes, admin.retention["memq.dev.t"]) == (1, 60_000)
    log.sync_retention("memq.dev.t", 5_000)                 # the topic's retention was altered
    assert (admin.describes, admin.retention["memq.dev.t"]) == (2, 5_000)
    admin.retention["memq.dev.t"] = 1                       # changed outside memq: seen within the hour
    clock.advance(RETENTION_RECHECK_S - 1)
    log.sync_retention("memq.dev.t", 5_000)
    assert admin.describes == 2
    clock.advance(2)
    log.sync_retention("memq.dev.t", 5_000)
    assert (admin.describes, admin.retention["memq.dev.t"]) == (3, 5_000)
