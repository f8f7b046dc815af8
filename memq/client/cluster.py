"""One way for every client to learn where a topic lives: the resolver.

The Producer, the Consumer, the Spark source and `memq status` all read brokers' `/v1/metadata`
as a `ClusterMetadata` and merge it with their configuration by one precedence rule:

    explicit settings of this client (Spark options) > broker metadata > config file > defaults

Broker metadata supplies the cluster name, the Kafka bootstrap servers, where batches are
stored (kind, bucket, endpoint, region, directory) and each topic's notification topic and
read partitions. A client names the topic it asks about (`?topic=`), so a broker that will not
let its principal describe it says so (`ClusterMetadata.refused`), whether or not the topic
exists: `refusal` turns that into an AuthorizationError, which no client retries or reads as an
unknown topic. The config file supplies what metadata never carries (credentials,
timeouts, client tuning), and everything when no broker is named. Brokers named explicitly
(`required`, e.g. Spark's `memq.broker`) must answer; brokers taken from the config file
(`producer.brokers`) are asked, and if none answers the config file alone decides (logged),
so a reader never depends on a broker being up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import aiohttp

from memq.config import UNSTATED_OFFSETS, ClusterConfig, MemqConfig, StorageConfig, TopicConfig
from memq.errors import AuthorizationError, BrokerUnavailableError, ConfigError, FormatError, UnknownTopicError
from memq.format.metadata import BrokerMetadata, ClusterMetadata, TopicMetadata

from ._auth import NO_AUTH, BrokerAuth

log = logging.getLogger(__name__)

METADATA_PATH = "/v1/metadata"


def broker_urls(raw: str) -> list[str]:
    """Comma-separated broker URLs (as in `producer.brokers`), normalised, in order."""
    return [u.strip().rstrip("/") for u in raw.split(",") if u.strip()]


def metadata_url(url: str, topics: Sequence[str] = ()) -> str:
    """Broker `url`'s metadata endpoint, naming `topics` so that refusals come back for them."""
    query = urllib.parse.urlencode([("topic", t) for t in topics])
    return url.rstrip("/") + METADATA_PATH + (f"?{query}" if query else "")


def refusal(md: ClusterMetadata, topic: str) -> AuthorizationError | None:
    """The AuthorizationError of a broker's refusal to show `topic` (None: not refused)."""
    r = md.refused.get(topic)
    if r is None:
        return None
    return AuthorizationError(
        f"principal {r.principal} may not {r.operation} topic {topic} (broker {md.broker_id}); using it needs "
        f"{r.operation} on it, or produce, which implies it: e.g. memq acl add allow {r.principal} produce "
        f"literal:{topic}")


def fetch_metadata(url: str, timeout_s: float, auth: BrokerAuth = NO_AUTH,
                   topics: Sequence[str] = ()) -> ClusterMetadata:
    """A broker's metadata, for blocking callers (Consumer, Spark driver, CLI); `topics` are
    the ones asked about by name (answered in `refused` when the principal may not see them)."""
    request = urllib.request.Request(metadata_url(url, topics), headers=auth.headers())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=auth.ssl_context) as resp:
            return ClusterMetadata.from_dict(json.loads(resp.read()))
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        raise auth.failure(url, e) from None
    except (ValueError, FormatError) as e:
        raise BrokerUnavailableError(f"metadata from {url}: {e}") from None


async def fetch_metadata_async(session: aiohttp.ClientSession, url: str, timeout_s: float,
                               auth: BrokerAuth = NO_AUTH, topics: Sequence[str] = ()) -> ClusterMetadata:
    """A broker's metadata, for asyncio callers (the Producer's router, whose session carries
    the credentials of `auth`: it only words the failures)."""
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(metadata_url(url, topics)) as resp:
                resp.raise_for_status()
                return ClusterMetadata.from_dict(await resp.json())
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        raise auth.failure(url, e) from None
    except (ValueError, FormatError) as e:
        raise BrokerUnavailableError(f"metadata from {url}: {e}") from None


def discover(urls: list[str], topic: str, timeout_s: float, auth: BrokerAuth = NO_AUTH) -> ClusterMetadata:
    """The metadata of the first broker (in order) that knows `topic`, else of the first that
    answered: ungoverned brokers each know only their own topics. AuthorizationError when no
    broker shows `topic` and one refused to."""
    answered: list[ClusterMetadata] = []
    errors: list[str] = []
    for url in urls:
        try:
            md = fetch_metadata(url, timeout_s, auth, (topic,))
        except BrokerUnavailableError as e:
            errors.append(str(e))
            continue
        if topic in md.topics:
            return md
        answered.append(md)
    refused = next((r for md in answered if (r := refusal(md, topic)) is not None), None)
    if refused is not None:
        raise refused
    if answered:
        return answered[0]
    raise BrokerUnavailableError(f"no broker answered {METADATA_PATH} ({'; '.join(errors) or 'none named'})")


@dataclass(frozen=True)
class ResolvedTopic:
    """A topic as a client sees it: its details, and the config to reach its Kafka and storage.
    `source` says where the notification topic came from (for an override of the cluster name);
    `brokers` are the cluster's as the metadata named them (none without metadata)."""

    config: MemqConfig
    topic: TopicMetadata
    source: Literal["metadata", "config", "default"]
    brokers: tuple[BrokerMetadata, ...] = ()


def resolve(config: MemqConfig, topic: str, metadata: ClusterMetadata | None) -> ResolvedTopic:
    """Merge broker metadata over the config file (pure: the precedence rule in one place)."""
    configured = next((t for t in config.topics if t.name == topic), None)
    if metadata is None:   # a topic neither described nor configured: its offsets unstated, read as positions
        cluster = config.cluster.name
        unstated = TopicConfig(name=topic, offsets=UNSTATED_OFFSETS)
        return ResolvedTopic(config, _from_config(configured or unstated, cluster),
                             "config" if configured is not None and configured.notification_topic else "default")
    st = metadata.storage
    if st.kind not in ("s3", "file"):
        raise ConfigError(f"broker {metadata.broker_id} serves storage kind {st.kind!r}; this client knows s3, file")
    kind: Literal["s3", "file"] = "s3" if st.kind == "s3" else "file"
    merged = dataclasses.replace(
        config,
        cluster=ClusterConfig(name=metadata.cluster),
        kafka=dataclasses.replace(config.kafka, bootstrap_servers=metadata.kafka_bootstrap_servers
                                  or config.kafka.bootstrap_servers),
        storage=StorageConfig(kind=kind, root_dir=st.root_dir if st.root_dir is not None else config.storage.root_dir),
        s3=dataclasses.replace(config.s3, bucket=st.bucket or config.s3.bucket, endpoint_url=st.endpoint_url,
                               region=st.region or config.s3.region))
    served = metadata.topics.get(topic)
    if served is not None:
        return ResolvedTopic(merged, served, "metadata", metadata.brokers)
    base = resolve(merged, topic, None)
    return dataclasses.replace(base, config=merged, brokers=metadata.brokers)


def resolve_topic(config: MemqConfig, topic: str, *, brokers: str | None = None,
                  timeout_s: float | None = None) -> ResolvedTopic:
    """Discover `topic` through brokers and resolve it against `config`.

    `brokers` (comma-separated URLs) are required to answer and to know the topic; without
    it, `config.producer.brokers` are asked and may fail over to the config file.
    """
    required = brokers is not None
    urls = broker_urls(brokers if brokers is not None else config.producer.brokers)
    timeout = timeout_s if timeout_s is not None else config.producer.request_timeout_ms / 1000
    if not urls:
        if required:
            raise BrokerUnavailableError("no broker URL given")
        return resolve(config, topic, None)
    try:
        metadata = discover(urls, topic, timeout, BrokerAuth.of(config.producer))
    except BrokerUnavailableError as e:
        if required:
            raise
        log.warning("topic %s: %s; using the config file alone", topic, e)
        return resolve(config, topic, None)
    if required and topic not in metadata.topics:
        raise UnknownTopicError(f"topic {topic!r} is unknown to memq broker(s) {', '.join(urls)}")
    return resolve(config, topic, metadata)


def _from_config(t: TopicConfig, cluster: str) -> TopicMetadata:
    return TopicMetadata(name=t.name, notification_topic=t.notification_topic_for(cluster),
                         read_partitions=t.read_partitions, retention_ms=t.retention_ms,
                         storage_group=t.storage_group, cleanup_policy=t.cleanup_policy, offsets=t.offsets)


__all__ = ["ResolvedTopic", "broker_urls", "discover", "fetch_metadata", "fetch_metadata_async", "metadata_url",
           "refusal", "resolve", "resolve_topic"]
