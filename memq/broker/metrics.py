"""Prometheus metrics of one broker, in its own registry (several brokers may share a process).

Per-stage latency follows the full-link idea: each Message's time at the broker is split into
queue wait (waiting for a free batch slot), batch fill (batch open -> sealed), upload (S3
PUT), notify (Kafka publish) and ack (ack ready -> written to the socket), so a slow stage
shows up by name. They are observed per batch, and the ack stage per ack frame (its oldest
ack's wait): one observation per small Message cost ~5% of a broker taking thousands a second. Those histograms are per topic for topics with objects of their own
(`memq_broker_stage_seconds`) and per storage group for the topics of a shared group
(`memq_broker_group_stage_seconds`): a group's topics share their objects, so their upload and
notify stages are the group's, and a thousand small topics would otherwise render ~90 lines
of /metrics each (~10 MB and 1-2 s of the broker's CPU per scrape).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from memq.config import TopicConfig

#: the labels of `memq_broker_topic_settings` besides the topic (memq.cost.counters.Seal reads them)
SEAL_LABELS = ("storage_group", "batch_bytes", "batch_ms", "min_batch_bytes", "max_batch_ms")
STAGES = ("queue_wait", "batch_fill", "upload", "notify", "ack")
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class BrokerMetrics:
    broker_id: str
    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))

    def __post_init__(self) -> None:
        r = self.registry
        self.stage_seconds = Histogram("memq_broker_stage_seconds",
                                       "Time spent per produce stage (per batch; ack: per ack frame, its oldest ack), topics with objects of their own",
                                       ["topic", "stage"], buckets=_BUCKETS, registry=r)
        self.group_stage_seconds = Histogram("memq_broker_group_stage_seconds",
                                             "Time spent per produce stage (per batch; ack: per ack frame, its oldest ack) by the topics of a shared storage group",
                                             ["group", "stage"], buckets=_BUCKETS, registry=r)
        self.messages = Counter("memq_broker_messages", "Messages accepted into a batch (counted as the batch seals)", ["topic"], registry=r)
        self.logmessages = Counter("memq_broker_logmessages", "LogMessages accepted into a batch (counted as the batch seals)",
                                   ["topic"], registry=r)
        self.bytes = Counter("memq_broker_message_bytes", "Message bytes accepted into a batch (counted as the batch seals)", ["topic"],
                             registry=r)
        self.batches = Counter("memq_broker_batches", "Batches finished, by result (ok, STORAGE, NOTIFY)",
                               ["topic", "result"], registry=r)
        self.batch_bytes = Histogram("memq_broker_batch_bytes", "Size of stored batches (a topic's part of an object)", ["topic"],
                                     buckets=tuple(4.0 ** i for i in range(5, 14)), registry=r)   # 1 KiB..64 MiB, x4: per topic, so few
        self.group_objects = Counter("memq_broker_group_objects",
                                     "Objects stored, by storage group (\"\": topics' own objects)",
                                     ["group"], registry=r)
        self.group_bytes = Counter("memq_broker_group_bytes",
                                   "Bytes of each topic's parts in a storage group's objects (to split its requests)",
                                   ["group", "topic"], registry=r)
        self.notification_bytes = Counter("memq_broker_notification_bytes",
                                          "Bytes of notifications published (batches ok count them)",
                                          ["topic"], registry=r)
        self.republished_notifications = Counter(
            "memq_broker_republished_notifications",
            "Notifications published again after a failed publish (the publish path's retries)", registry=r)
        # what `memq cost` models a topic's objects from (memq.cost.breakeven): its seal settings as
        # this broker applies them and its storage group ("": its own objects), one line per topic (1)
        self.topic_settings = Gauge("memq_broker_topic_settings",
                                    "1 per hosted topic, its seal settings as labels (max_batch_ms: the age a "
                                    "batch under min_batch_bytes may reach)",
                                    ["topic", *SEAL_LABELS], registry=r)
        self.schema_checks = Gauge("memq_broker_topic_schema_checks",
                                   "1 per hosted topic and part (key, value) its schema checks cover, with their action",
                                   ["topic", "part", "action"], registry=r)
        self.started = Gauge("memq_broker_start_time_seconds", "Unix time this broker's counters started from",
                             registry=r)
        self.started.set_to_current_time()
        self.flush_seals = Counter("memq_broker_flush_seals",
                                   "Batches sealed early because a producer flushed (RequestFlag.SEAL)",
                                   ["topic"], registry=r)
        self.held_batches = Counter(
            "memq_broker_held_batches",
            "Batches kept filling past batch_ms because they held under min_batch_bytes (latency budget)",
            ["topic"], registry=r)
        self.throttled_batches = Counter(
            "memq_broker_throttled_batches",
            "Batches kept filling past batch_ms because the storage answered SlowDown (fewer, larger PUTs)",
            ["topic"], registry=r)
        self.unannounced_batches = Counter(
            "memq_broker_unannounced_batches",
            "Stored batches whose notification publish failed; kept (it may still land), orphans otherwise",
            ["topic"], registry=r)
        self.duplicate_messages = Counter(
            "memq_broker_duplicate_messages",
            "Resent Messages not stored again: this broker held or had stored the original", ["topic"], registry=r)
        self.rejected = Counter("memq_broker_rejected", "Requests answered with an error ack, by code",
                                ["code"], registry=r)
        self.busy_slots = Gauge("memq_broker_ring_busy_slots", "Batch slots filling or uploading", ["topic"],
                                registry=r)
        self.bundles = Counter("memq_broker_bundles", "Produce frames that held several requests (wire bundles)",
                               registry=r)
        self.bundled_requests = Counter("memq_broker_bundled_requests", "Requests that came in bundles", registry=r)
        self.connections = Gauge("memq_broker_connections", "Open produce connections", registry=r)
        self.slow_clients = Counter("memq_broker_slow_client_closes",
                                    "Connections closed because the client did not read its acks", registry=r)
        # security (memq.broker.guard)
        self.schema_invalid = Counter("memq_broker_schema_invalid_records",
                                      "Records failing their topic's schema checks, by what was done (reject, warn)",
                                      ["topic", "action"], registry=r)
        self.denials = Counter("memq_broker_denials",
                               "Requests refused: no valid credentials (operation=authenticate) or denied by an ACL",
                               ["operation"], registry=r)
        # quotas (memq.security.quota)
        self.throttle_seconds = Counter(
            "memq_broker_throttle_seconds",
            "Time produce connections were not read because a byte-rate quota was exceeded (principal "
            "'anonymous' with security off)", ["principal", "topic"], registry=r)

        # the read path (memq.broker.read_cache, memq.broker.reads)
        self.read_cache_hits = Counter("memq_broker_read_cache_hits",
                                       "Read cache lookups answered from memory or by a load already in flight",
                                       registry=r)
        self.read_cache_misses = Counter("memq_broker_read_cache_misses", "Read cache lookups that started a load",
                                         registry=r)
        self.read_cache_bytes = Gauge("memq_broker_read_cache_bytes", "Bytes held by the read cache", registry=r)
        self.read_cache_evictions = Counter("memq_broker_read_cache_evictions",
                                            "Read cache entries dropped to stay within broker.read_cache_bytes",
                                            registry=r)
        self.read_gets = Counter("memq_broker_read_gets", "Ranged GETs of parts for readers (read cache misses)",
                                 registry=r)
        self.read_get_bytes = Counter("memq_broker_read_get_bytes", "Bytes of parts GET for readers", registry=r)
        # memq's own Consumer reading through this broker (memq.broker.doors.read)
        self.part_reads = Counter("memq_broker_part_reads", "Part reads of memq Consumers (/v1/read), by result",
                                  ["result"], registry=r)
        self.part_read_bytes = Counter("memq_broker_part_read_bytes", "Part bytes served to memq Consumers",
                                       registry=r)

    def hosted(self, topic: TopicConfig) -> None:
        """Report `topic`'s settings (it is hosted here now, with these)."""
        self.topic_settings.labels(topic.name, *_seal_labels(topic)).set(1)
        for part in _checked_parts(topic):
            self.schema_checks.labels(topic.name, part, topic.schema_validation_action).set(1)

    def unhosted(self, topic: TopicConfig) -> None:
        """Stop reporting `topic`'s settings (it left this broker, or is re-added with new ones)."""
        try:
            self.topic_settings.remove(topic.name, *_seal_labels(topic))
        except KeyError:
            pass
        for part in _checked_parts(topic):
            try:
                self.schema_checks.remove(topic.name, part, topic.schema_validation_action)
            except KeyError:
                pass

    def stage(self, topic: str, group: str, stage: str) -> Histogram:
        """The histogram child a topic's `stage` is observed in: its own, or its shared group's."""
        if group:
            return self.group_stage_seconds.labels(group, stage)
        return self.stage_seconds.labels(topic, stage)


def _seal_labels(topic: TopicConfig) -> tuple[str, ...]:
    return (topic.storage_group, str(topic.batch_bytes), str(topic.batch_ms), str(topic.min_batch_bytes),
            str(topic.hold_until_ms))


def _checked_parts(topic: TopicConfig) -> tuple[str, ...]:
    """The parts of a topic's records its schema checks cover."""
    return tuple(p for p, on in (("key", topic.key_schema_validation), ("value", topic.value_schema_validation)) if on)
