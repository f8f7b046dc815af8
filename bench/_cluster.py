"""What the benchmarks share: one dev cluster with one broker process, and the broker's metrics.

`bench_cluster` starts the servers (moto S3, tansu, optionally ZooKeeper) in a temporary
directory, one broker process for `topics`, and yields a config whose producer points at that
broker; everything is stopped and removed on exit.
"""

from __future__ import annotations

import dataclasses
import tempfile
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from memq.config import BrokerConfig, MemqConfig, TopicConfig
from memq.devcluster import DevCluster
from memq.devcluster.broker_process import BrokerProcess


@dataclass(frozen=True)
class BenchCluster:
    dc: DevCluster
    broker: BrokerProcess
    config: MemqConfig          # the cluster's servers, `topics`, producer.brokers = the broker


@contextmanager
def bench_cluster(topics: Iterable[TopicConfig], *, broker_id: str = "bench",
                  zookeeper: bool = True) -> Iterator[BenchCluster]:
    with tempfile.TemporaryDirectory(prefix="memq-bench-") as tmp, \
            DevCluster(Path(tmp) / "cluster", zookeeper=zookeeper) as dc:
        config = dataclasses.replace(dc.config(topics=topics), broker=BrokerConfig(broker_id=broker_id))
        with BrokerProcess(config, Path(tmp) / "brokers") as broker:
            config = dataclasses.replace(config, producer=dataclasses.replace(config.producer, brokers=broker.url))
            yield BenchCluster(dc, broker, config)


def broker_samples(url: str, metric: str) -> list[Sample]:
    """The samples of one metric family (e.g. `memq_broker_stage_seconds`) on a broker's /metrics."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == metric:
            return list(family.samples)
    raise RuntimeError(f"broker {url} exports no metric {metric}")
