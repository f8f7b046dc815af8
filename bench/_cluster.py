"""What the benchmarks share: one governed broker on a dev cluster, and the broker's metrics.

`bench_cluster` starts the servers (moto S3, tansu, ZooKeeper) in a temporary directory and a
`GovernedCluster` of one broker (the way `memq dev` and the tests run brokers), creates
`topics` through its governor (in bulk: a bench may want a thousand), and yields a config
whose producer points at that broker; `s3_link` can put something between every client and
S3 (a fault proxy) and change the S3 section (hedging);
everything is stopped and removed on exit. `read_memq` times memq's Consumer the one way
every bench compares it: from the group assignment to the N-th record.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from memq.client.consumer import Consumer
from memq.config import GovernorConfig, MemqConfig, S3Config, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster
from memq.devcluster.governed import FAST_GOVERNOR
from memq.devcluster.broker_process import BrokerProcess
from memq.governor.topics import hosted_topics
from memq.notify import KafkaTopic, TopicAdmin


@dataclass(frozen=True)
class BenchCluster:
    dc: DevCluster
    broker: BrokerProcess
    config: MemqConfig          # the cluster's servers, `topics`, producer.brokers = the broker


@dataclass(frozen=True)
class _WithSections:
    """The dev cluster's config with some sections replaced (e.g. `security`, `quota`)."""

    dc: DevCluster
    sections: dict[str, Any]

    def config(self, cluster: str = "dev") -> MemqConfig:
        return dataclasses.replace(self.dc.config(cluster=cluster), **self.sections)


@contextmanager
def bench_cluster(topics: Iterable[TopicConfig], governor: GovernorConfig = FAST_GOVERNOR,
                  s3_link: Callable[[S3Config, Path], AbstractContextManager[S3Config]] | None = None,
                  **sections: Any) -> Iterator[BenchCluster]:
    """`sections`: config sections every broker (and the yielded config) gets, e.g. `quota=QuotaConfig(...)`;
    `governor`: its cycles (the dev cluster's fast ones by default, so topics are placed at once);
    `s3_link`: given the dev cluster's S3 section and a scratch directory, a context yielding the
    S3 section everyone uses instead, for as long as the cluster runs."""
    with tempfile.TemporaryDirectory(prefix="memq-bench-") as tmp, \
            DevCluster(Path(tmp) / "servers") as dc, \
            (s3_link(dc.config().s3, Path(tmp)) if s3_link else nullcontext(None)) as s3, \
            GovernedCluster(tmp, brokers=1, servers=_WithSections(dc, sections | ({"s3": s3} if s3 else {})),
                            cluster="bench", governor=governor) as gc:
        broker = gc.broker("b1")
        _create_topics(gc, broker.url, list(topics))
        yield BenchCluster(dc, broker, gc.config())


def _create_topics(gc: GovernedCluster, url: str, topics: list[TopicConfig], timeout_s: float = 120.0) -> None:
    """Create `topics` as the governor's topic admin does (notification topic, then znode), their
    notification topics in one Kafka request; return once the broker at `url` hosts them all."""
    failed = TopicAdmin(gc.base.kafka).create_topics(
        [KafkaTopic(t.notification_topic_for(gc.cluster), t.read_partitions, t.retention_ms) for t in topics])
    if failed:
        raise RuntimeError(f"{len(failed)} notification topics not created, e.g. {next(iter(failed.values()))}")
    for t in topics:
        gc.registry.create_topic(t)
    wanted = {t.name for t in topics}
    deadline = time.monotonic() + timeout_s
    while missing := wanted - set(hosted_topics(url)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(missing)} of {len(wanted)} topics not hosted by {url} after {timeout_s:.0f} s")
        time.sleep(0.2)


def broker_samples(url: str, metric: str) -> list[Sample]:
    """The samples of one metric family (e.g. `memq_broker_stage_seconds`) on a broker's /metrics."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == metric:
            return list(family.samples)
    raise RuntimeError(f"broker {url} exports no metric {metric}")


@dataclass(frozen=True)
class ConsumerRead:
    """One Consumer pass over a topic: `read_s` from group assignment to the n-th record."""

    read_s: float
    total_s: float              # including the group join (tansu admits members late)
    records: int
    value_bytes: int


def read_memq(config: MemqConfig, topic: str, n: int, timeout_s: float = 120.0) -> ConsumerRead:
    """Read `n` records with a fresh consumer group, every record in the application's hands."""
    t0 = time.monotonic()
    assigned: list[float] = []
    got = size = 0
    with Consumer(config, topic, group_id=f"bench-{uuid.uuid4().hex[:6]}",
                  on_assign=lambda _: assigned.append(time.monotonic())) as c:
        deadline = t0 + timeout_s
        while got < n and time.monotonic() < deadline:
            for rec in c.poll(1.0):
                got += 1
                size += len(rec.value)
        end = time.monotonic()
    if got < n or not assigned:
        raise RuntimeError(f"memq consumer read {got} of {n} from topic {topic} within {timeout_s:.0f}s")
    return ConsumerRead(end - assigned[0], end - t0, got, size)


def kafka_produce_s(bootstrap: str, topic: str, values: list[bytes]) -> float:
    """Seconds for a confluent-kafka Producer to send every value and get every acks=all."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.num.messages": 10_000,
                  "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 1_048_576})
    delivered = 0

    def on_delivery(err: object, _msg: object) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1

    t0 = time.perf_counter()
    produce = p.produce
    for v in values:
        try:
            produce(topic, v, on_delivery=on_delivery)
        except BufferError:
            p.poll(0.01)
            produce(topic, v, on_delivery=on_delivery)
    p.flush(120)
    elapsed = time.perf_counter() - t0
    if delivered != len(values):
        raise RuntimeError(f"{bootstrap}: delivered {delivered} of {len(values)}")
    return elapsed
