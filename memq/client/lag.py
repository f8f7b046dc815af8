"""Consumer groups' lag as Kafka's tools compute it: a partition's high watermark minus the group's
committed offset, asked of a broker's Kafka listener (the answers `kafka-consumer-groups`,
AdminClient and lag exporters get). On a topic with dense offsets (`TopicConfig.offsets`) that is
the number of records the group has not read; on a sparse one it is not a record count, so it is
not summed (`GroupLag.records` None).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from memq.errors import KafkaUnreachableError
from memq.format.metadata import ClusterMetadata, TopicMetadata


@dataclass(frozen=True, slots=True)
class GroupLag:
    """A group's lag on one topic, over the partitions it committed on."""

    group: str
    topic: str
    partitions: int             # partitions with a commit
    records: int | None         # records not read yet (None: sparse offsets, not a count)


def cluster_lags(meta: ClusterMetadata, timeout_s: float) -> list[GroupLag] | None:
    """`group_lags` of the cluster's topics through the first broker with a Kafka listener (None: none has one)."""
    listener = next((b.kafka_address for b in meta.brokers if b.kafka_address), "")
    return group_lags(listener, meta.topics, timeout_s) if listener else None


def group_lags(kafka_address: str, topics: Mapping[str, TopicMetadata], timeout_s: float) -> list[GroupLag]:
    """Every Kafka consumer group's lag on each of `topics` it committed on; KafkaUnreachableError
    when the listener does not answer."""
    conf: dict[str, str | int | float | bool] = {"bootstrap.servers": kafka_address,
                                                 "socket.timeout.ms": int(timeout_s * 1000)}
    admin = AdminClient(conf)
    asked = [TopicPartition(t, p) for t, m in sorted(topics.items()) for p in range(m.read_partitions)]
    reader = Consumer({**conf, "group.id": "memq-status", "enable.auto.commit": False})
    try:
        groups = sorted(g.group_id for g in admin.list_consumer_groups(request_timeout=timeout_s).result(timeout_s).valid)
        if not groups or not asked:
            return []
        highs: dict[tuple[str, int], int] = {}
        out = []
        for g in groups:   # one group a call: librdkafka's limit
            listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(g, asked)],
                                                       request_timeout=timeout_s)[g].result(timeout_s)
            behind: dict[str, list[int]] = {}
            for tp in listed.topic_partitions:
                if tp.offset < 0 or tp.error is not None:
                    continue   # no commit there
                key = (tp.topic, tp.partition)
                if key not in highs:
                    highs[key] = reader.get_watermark_offsets(TopicPartition(*key), timeout=timeout_s)[1]
                behind.setdefault(tp.topic, []).append(max(highs[key] - tp.offset, 0))
            out += [GroupLag(g, t, len(lags), sum(lags) if topics[t].offsets == "dense" else None)
                    for t, lags in sorted(behind.items())]
        return out
    except (KafkaException, TimeoutError) as e:
        raise KafkaUnreachableError(f"Kafka listener {kafka_address}: consumer groups: {e}") from None
    finally:
        reader.close()
