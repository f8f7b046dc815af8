"""The dashboard's schema panel: each topic's schemas and the records its checks refused,
dead-lettered or let through with a warning, read from the brokers (blocking HTTP, bounded by
timeouts; the dashboard calls it in a thread).

A topic's schemas are the latest versions of its TopicNameStrategy subjects (`<topic>-value`,
`<topic>-key`) in the brokers' registry; its counts are
`memq_broker_schema_invalid_records_total{topic,action}` summed over every broker that answers
(`reject`: refused, `dlq`: dead-lettered, `warn`: stored and counted); its checks (which parts,
which action) are what its brokers report in `memq_broker_topic_schema_checks{topic,part,action}`.
A topic with no subject, no checks and no count is left out.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from memq.client._auth import BrokerAuth
from memq.client.cluster import fetch_metadata
from memq.client.schemas import SchemaClient, subject_path
from memq.config import MemqConfig
from memq.cost.scrape import cluster_brokers, metrics_texts
from memq.errors import MemqError

INVALID = "memq_broker_schema_invalid_records"
CHECKS = "memq_broker_topic_schema_checks"
ACTIONS = ("reject", "dlq", "warn")


def invalid_counts(texts: list[str]) -> dict[str, dict[str, float]]:
    """topic -> action -> records, summed over the brokers' Prometheus texts (pure)."""
    return read_metrics(texts)[0]


def read_metrics(texts: list[str]) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, str]]]:
    """(topic -> action -> invalid records summed over the brokers, topic -> part -> action of
    its checks as any broker hosting it reports them), from the brokers' Prometheus texts (pure)."""
    counts: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(ACTIONS, 0.0))
    checks: dict[str, dict[str, str]] = defaultdict(dict)
    for text in texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if sample.name == INVALID + "_total":
                    topic, action = labels.get("topic", ""), labels.get("action", "")
                    counts[topic][action] = counts[topic].get(action, 0.0) + sample.value
                elif sample.name == CHECKS and sample.value:
                    checks[labels.get("topic", "")][labels.get("part", "")] = labels.get("action", "")
    return dict(counts), dict(checks)


def schema_panel(config: MemqConfig, timeout_s: float) -> dict[str, Any]:
    """`{"topics": {topic: {"value": schema | None, "key": schema | None, "checks": {part: action},
    "invalid": {action: n}}}}`, a schema being `{"subject", "version", "id", "type"}`."""
    auth = BrokerAuth.of(config.producer)
    urls = cluster_brokers(config.producer.brokers, timeout_s, auth)
    topics = sorted(fetch_metadata(urls[0], timeout_s, auth).topics)
    counts, checks = read_metrics([text for _, text, _ in metrics_texts(urls, timeout_s, auth)])
    registry = SchemaClient(config.producer, timeout_s)
    subjects = set(registry.call("GET", "/subjects"))
    out: dict[str, Any] = {}
    for topic in sorted(set(topics) | set(counts) | set(checks)):
        row: dict[str, Any] = {"invalid": counts.get(topic, dict.fromkeys(ACTIONS, 0.0)),
                               "checks": checks.get(topic, {})}
        for part in ("value", "key"):
            subject = f"{topic}-{part}"
            row[part] = _latest(registry, subject) if subject in subjects else None
        if row["value"] or row["key"] or topic in counts or topic in checks:
            out[topic] = row
    return {"topics": out}


def _latest(registry: SchemaClient, subject: str) -> dict[str, Any] | None:
    try:
        got = registry.call("GET", f"/subjects/{subject_path(subject)}/versions/latest")
    except MemqError:   # deleted since it was listed
        return None
    return {"subject": subject, "version": got["version"], "id": got["id"], "type": got.get("schemaType", "AVRO")}
