"""The pure parts of `python -m bench many_topics`: its pricing and its count of sampled sends."""

from __future__ import annotations

import pytest

from bench.many_topics import prices, sent_to_first
from memq.config import CostConfig
from memq.cost import TopicCounters, Usage

MiB = 1024 ** 2


def _rates(puts_per_s: float, parts_per_s: float, bytes_per_s: float) -> Usage:
    r = TopicCounters(bytes_in=bytes_per_s, objects=parts_per_s,
                      requests={"put": puts_per_s, "get": 0.0, "list": 0.0, "delete": 0.0})
    return Usage("case", 1.0, r, r)


def test_the_issues_hundred_topic_figure_prices_at_about_four_times_kafkas_replication() -> None:
    """330 objects/s for 10 MiB/s at public S3 prices: ~$0.17 per GiB in PUTs, Kafka's cross-zone
    replication to 2 followers $0.04 per GiB ($0.01 out and in per GB)."""
    p = prices(_rates(330.0, 330.0, 10 * MiB), CostConfig())
    assert p.put_usd_per_gib == pytest.approx(330 * 0.005 / 1000 / (10 / 1024))
    assert p.kafka_replication_usd_per_gib == pytest.approx(0.04)
    assert p.put_vs_kafka == pytest.approx(4.22, abs=0.01)
    assert p.put_usd_month == pytest.approx(330 * 730 * 3600 * 0.005 / 1000)
    assert p.consumer_get_usd_month == pytest.approx(330 * 730 * 3600 * 0.0004 / 1000)


def test_shared_objects_price_their_puts_not_their_parts() -> None:
    shared = prices(_rates(4.0, 1000.0, 100_000.0), CostConfig())
    own = prices(_rates(1000.0, 1000.0, 100_000.0), CostConfig())
    assert own.put_usd_month == pytest.approx(250 * shared.put_usd_month)
    assert own.consumer_get_usd_month == pytest.approx(shared.consumer_get_usd_month)   # a GET per part either way


@pytest.mark.parametrize(("sent", "topics", "first", "expected"),
                         [(0, 10, 3, 0), (2, 10, 3, 2), (10, 10, 3, 3), (25, 10, 3, 9), (21, 10, 3, 7), (5, 1, 1, 5)])
def test_sent_to_first_counts_round_robin_sends_to_the_first_topics(sent: int, topics: int, first: int,
                                                                   expected: int) -> None:
    assert sent_to_first(sent, topics, first) == expected
