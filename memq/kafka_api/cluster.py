"""Kafka's cluster calls answered from memq's cluster view, sans I/O: DescribeCluster,
DescribeLogDirs, OffsetForLeaderEpoch and DescribeProducers.

- The brokers are those Metadata lists (`mapping.metadata_view`: node id = CRC32C of the broker
  id); the cluster id is memq's cluster name, as Metadata says it; the controller is the
  governor's broker when it has a Kafka listener, else the broker answering (memq has no
  controller: the governor is what places topics).
- Log dirs: a broker keeps no partition on disk, its one "log dir" is the bucket (`log_dir`);
  it lists the partitions it leads in Metadata, of size 0 (the bytes are objects in S3, which
  `memq cost` counts), no lag, never a future replica.
- Leader epochs: memq has none (Metadata and fetched batches say -1, so clients skip KIP-320's
  validation); a client that asks anyway for epoch E gets E back with the partition's high
  watermark as its end, so it never finds its position truncated.
- Producers: memq keeps no Kafka producer state per partition (its de-duplication is per topic
  processor, by memq ids): each partition answers an empty list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kafka.protocol.admin import (DescribeClusterResponse,
                                  DescribeLogDirsResponse, DescribeProducersResponse)
from kafka.protocol.consumer import OffsetForLeaderEpochResponse

from memq.format.metadata import ClusterMetadata, StorageMetadata

from .mapping import metadata_view, node_id
from .protocol import ErrorCode

#: DescribeCluster's endpoint type: brokers (memq has no separate controllers).
BROKERS = 1

#: Kafka's cluster operations (AclOperation codes) by the memq operation on the cluster
#: (`security.acl.CLUSTER_RESOURCE`) that grants them ("": none needed, memq lets any producer
#: be idempotent).
_CLUSTER_OPERATIONS: dict[str, tuple[int, ...]] = {
    "": (12,),                       # IDEMPOTENT_WRITE
    "describe": (8, 10),             # DESCRIBE, DESCRIBE_CONFIGS
    "admin": (7, 11, 13, 14),        # ALTER, ALTER_CONFIGS, CREATE_TOKENS, DESCRIBE_TOKENS
}


def cluster_operations(may: Callable[[str], bool]) -> frozenset[int]:
    """The Kafka operations (codes: the bits of the authorized-operations field) on the cluster
    allowed to whom `may` (a memq operation on the cluster) speaks for; none when it may not
    describe the cluster, as Kafka answers."""
    if not may("describe"):
        return frozenset()
    return frozenset(c for op, codes in _CLUSTER_OPERATIONS.items() if not op or may(op) for c in codes)


def controller(meta: ClusterMetadata, governor: str | None, me: str) -> int:
    """The node id DescribeCluster names as controller: the governor's broker when it has a
    Kafka listener, else this broker."""
    listeners = {b.id for b in meta.brokers if b.kafka_address}
    return node_id(governor if governor in listeners else me)


def describe_cluster(meta: ClusterMetadata, controller_id: int, endpoint_type: int = BROKERS,
                     authorized_operations: frozenset[int] | None = None) -> Any:
    """A DescribeClusterResponse: the brokers Metadata lists; MISMATCHED_ENDPOINT_TYPE for any
    endpoint type but brokers. `authorized_operations`: None when not asked (Kafka's
    -2147483648)."""
    r = DescribeClusterResponse
    if endpoint_type != BROKERS:
        return r(throttle_time_ms=0, error_code=ErrorCode.MISMATCHED_ENDPOINT_TYPE, endpoint_type=endpoint_type,
                 error_message="memq brokers answer for brokers only (endpoint type 1): memq has no controllers",
                 cluster_id=meta.cluster, controller_id=-1, brokers=[], authorized_operations=authorized_operations)
    nodes, _ = metadata_view(meta, ())
    brokers = [r.DescribeClusterBroker(broker_id=n.node_id, host=n.host, port=n.port, rack=n.rack, is_fenced=False)
               for n in nodes]
    return r(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None, endpoint_type=BROKERS,
             cluster_id=meta.cluster, controller_id=controller_id, brokers=brokers,
             authorized_operations=authorized_operations)


def log_dir(storage: StorageMetadata) -> str:
    """The one log dir of every memq broker: where its topics' objects are."""
    if storage.kind == "s3":
        return f"s3://{storage.bucket}"
    return f"file://{storage.root_dir}" if storage.root_dir else f"memq:{storage.kind}"


def led_here(meta: ClusterMetadata, me: str, asked: Sequence[tuple[str, Sequence[int]]] | None
             ) -> list[tuple[str, list[int]]]:
    """The (topic, partitions) of `asked` (None: every topic in `meta`) that broker `me` leads
    in Metadata; unknown topics and partitions are left out, as Kafka leaves out replicas a
    broker does not hold."""
    here = node_id(me)
    wanted = None if asked is None else {t: set(ps) for t, ps in asked}
    _, topics = metadata_view(meta, None if wanted is None else tuple(t for t in wanted if t in meta.topics))
    out = []
    for t in topics:
        parts = [i for i, leader in enumerate(t.leaders) if leader == here
                 and (wanted is None or i in wanted[t.name])]
        if parts:
            out.append((t.name, parts))
    return out


def describe_log_dirs(storage: StorageMetadata, partitions: Iterable[tuple[str, list[int]]],
                      error: ErrorCode = ErrorCode.NONE) -> Any:
    """A DescribeLogDirsResponse: one log dir holding `partitions` (nothing with an `error`:
    Kafka answers no dir to whom may not describe the cluster, with the error from v3)."""
    r = DescribeLogDirsResponse
    result, topic, partition = r.DescribeLogDirsResult, r.DescribeLogDirsResult.DescribeLogDirsTopic, \
        r.DescribeLogDirsResult.DescribeLogDirsTopic.DescribeLogDirsPartition
    if error:
        return r(throttle_time_ms=0, error_code=error, results=[])
    topics = [topic(name=t, partitions=[partition(partition_index=p, partition_size=0, offset_lag=0,
                                                  is_future_key=False) for p in parts])
              for t, parts in partitions]
    return r(throttle_time_ms=0, error_code=ErrorCode.NONE, results=[result(
        error_code=ErrorCode.NONE, log_dir=log_dir(storage), topics=topics, total_bytes=-1, usable_bytes=-1)])


def epoch_end(requested_epoch: int, high_watermark: int) -> tuple[int, int]:
    """(leader epoch, end offset) OffsetForLeaderEpoch answers for `requested_epoch`: the same
    epoch ending at the high watermark, so no position is ever truncated; an unknown epoch (-1)
    gets Kafka's undefined (-1, -1)."""
    if requested_epoch < 0:
        return -1, -1
    return requested_epoch, high_watermark


EpochAnswer = tuple[str, list[tuple[int, int, int, int]]]   # topic, [(partition, error, epoch, end offset)]


def offset_for_leader_epoch(topics: Sequence[EpochAnswer]) -> Any:
    r = OffsetForLeaderEpochResponse
    t, p = r.OffsetForLeaderTopicResult, r.OffsetForLeaderTopicResult.EpochEndOffset
    return r(throttle_time_ms=0, topics=[
        t(topic=name, partitions=[p(error_code=e, partition=i, leader_epoch=epoch, end_offset=end)
                                  for i, e, epoch, end in parts]) for name, parts in topics])


def describe_producers(topics: Sequence[tuple[str, list[tuple[int, int]]]]) -> Any:
    """A DescribeProducersResponse: each (partition, error) with no active producer (see the
    module doc)."""
    r = DescribeProducersResponse
    t, p = r.TopicResponse, r.TopicResponse.PartitionResponse
    return r(throttle_time_ms=0, topics=[
        t(name=name, partitions=[p(partition_index=i, error_code=e, error_message=None, active_producers=[])
                                 for i, e in parts]) for name, parts in topics])
