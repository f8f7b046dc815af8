"""The pure parts of `python -m bench many_topics`: its pricing and its count of sampled sends."""

from __future__ import annotations

import pytest

from bench.many_topics import case_ratios, prices, read_costs, sent_to_first
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


def test_ratios_are_given_for_the_cases_that_ran() -> None:
    def case(cpu: float, p99: float, objects: float = 3.0, put_vs_kafka: float = 0.05, notify: float = 1.0) -> dict:
        return {"broker_cpu_core_frac": cpu, "e2e_p99_s": p99, "objects_per_s": objects,
                "put_cost_vs_kafka": put_vs_kafka, "broker_stages": {"notify": {"mean_s": notify}},
                "reads": {"gets_per_part_per_broker": 0.5, "consumer_get_vs_put": 0.25}}

    everything = case_ratios({"trickle": case(0.2, 4.0, objects=2.0, notify=2.0), "hundred": case(0.3, 0.6),
                              "one": case(0.06, 0.3)}, fanout_s=1.0)
    assert everything == {"trickle_objects_per_s_vs_goal": 2.0, "trickle_cpu_vs_goal": 0.5,
                          "kafka_fanout_vs_trickle_notify": 0.5, "hundred_put_cost_vs_kafka_vs_goal": 2.0,
                          "hundred_gets_per_part_per_broker_vs_goal": 2.0, "hundred_consumer_get_vs_put_vs_goal": 2.0,
                          "hundred_cpu_vs_2x_one": 0.4, "hundred_e2e_p99_vs_one": 0.5}
    assert case_ratios({"one": case(0.06, 0.3)}, None) == {}
    assert set(case_ratios({"hundred": case(0.3, 0.6)}, None)) == {
        "hundred_put_cost_vs_kafka_vs_goal", "hundred_gets_per_part_per_broker_vs_goal",
        "hundred_consumer_get_vs_put_vs_goal"}


def test_counted_gets_are_priced_for_every_topic_and_group() -> None:
    """Reading S3 directly (one GET per part per group) the issue's 100 parts per object cost 8x the
    object's PUT per group; through the broker, with its cache filled on write, nothing."""
    p = CostConfig()
    put_usd = 4.0 * 730 * 3600 * p.s3_put_per_1000 / 1000            # 4 objects/s of 100 parts
    direct = read_costs({"batches": 300.0, "parts_via_broker": 0.0, "parts_via_s3": 300.0, "broker_fallbacks": 0.0},
                        0.0, 3, 400.0, put_usd, p)
    assert direct["s3_gets_per_part_read"] == 1.0 and direct["consumer_get_vs_put"] == pytest.approx(3 * 8.0)
    cached = read_costs({"batches": 300.0, "parts_via_broker": 300.0, "parts_via_s3": 0.0, "broker_fallbacks": 0.0},
                        100.0, 3, 400.0, put_usd, p)   # the broker GET each part once, the groups none
    assert cached["gets_per_part_per_broker"] == 1.0 and cached["consumer_get_vs_put"] == pytest.approx(8.0)
