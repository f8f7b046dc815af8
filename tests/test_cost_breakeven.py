"""The break-even rate and the suggestions of `memq cost` (memq.cost.breakeven): pure, no I/O."""

from __future__ import annotations

import dataclasses
import random

import pytest

from memq.config import CostConfig
from memq.cost import Seal, TopicCounters, Usage, estimate, parse_metrics, usage
from memq.cost.breakeven import (MIN_BROKERS, MiB, Peers, Shape, batches_per_s, break_even, cost_at, describe,
                                 shape_of, verdict)
from memq.cost.counters import Compacted
from memq.cost.view import report

P = CostConfig()
WEEK = 7 * 86_400.0


def measured(topic: str, bytes_per_s: float, *, brokers: int = 2, seal: Seal = Seal(), message_bytes: float = 100.0,
             window_s: float = 600.0, list_per_s: float = 0.0) -> Usage:
    """A topic's usage as the brokers would report a steady rate: batches as its settings seal them."""
    x = bytes_per_s / brokers
    batches = brokers * batches_per_s(seal, x, message_bytes)
    rates = TopicCounters(bytes_in=bytes_per_s, messages=bytes_per_s / message_bytes, objects=batches,
                          stored_bytes=bytes_per_s * 1.02, notifications=batches, notification_bytes=batches * 280,
                          requests={"put": batches, "get": 0.0, "list": list_per_s, "delete": batches})
    names = tuple(f"b{i}" for i in range(brokers))
    return Usage(topic, window_s, rates.scaled(window_s), rates, None, dict.fromkeys(names, x), seal, names)


def dearer(shape: Shape, bytes_per_s: float) -> float:
    """memq minus Kafka per month at a steady `bytes_per_s`, by the model itself."""
    e = cost_at(shape, bytes_per_s, WEEK, P)
    return e.memq_usd - e.kafka_usd


def test_batches_follow_size_age_latency_budget_and_messages() -> None:
    seal = Seal(batch_bytes=8 * MiB, batch_ms=250, min_batch_bytes=MiB, max_batch_ms=10_000)
    assert batches_per_s(Seal(), 1000.0) == 4.0                                  # sealed by age
    assert batches_per_s(Seal(), 64 * MiB) == 8.0                                # by size
    assert batches_per_s(Seal(), 1000.0, message_bytes=1000.0) == 1.0            # one Message a second
    assert batches_per_s(seal, 1000.0) == pytest.approx(0.1)                     # held to max_batch_ms
    assert batches_per_s(seal, MiB) == 1.0                                       # until min_batch_bytes
    assert batches_per_s(seal, 16 * MiB) == 4.0                                  # past it: batch_ms again
    assert batches_per_s(Seal(), 0.0) == 0.0


def test_a_trickle_is_below_its_break_even_and_a_longer_batch_ms_brings_it_under_kafka() -> None:
    trickle = measured("demo", 20_000.0)                       # ~0.02 MiB/s on 2 brokers, batch_ms 250
    used = {"demo": trickle}
    shape = shape_of(trickle, used)
    assert shape.brokers == 2 and shape.message_bytes == 100.0 and shape.notification_bytes == 280.0
    be = break_even(shape, WEEK, P)
    assert be is not None and 0.2 * MiB < be < 1 * MiB
    assert dearer(shape, be * 0.999) > 0 > dearer(shape, be * 1.001)          # it is where the costs cross
    v = verdict(trickle, used, WEEK, P, estimate(trickle, WEEK, P))
    assert not v.above and v.now_bps == 20_000.0 and v.memq_usd > 10 * v.kafka_usd
    # the model at the rate now is the measured bill (a steady topic)
    assert v.memq_usd == pytest.approx(estimate(trickle, WEEK, P).memq_usd, rel=1e-9)
    (longer,) = v.suggestions                                   # no group to join, no broker to spare
    ms = int(longer.setting.removeprefix("batch_ms="))
    assert 250 < ms <= 10_000 and longer.cheaper and longer.memq_usd < v.kafka_usd
    slower = dataclasses.replace(shape, seal=dataclasses.replace(shape.seal, batch_ms=ms, max_batch_ms=ms))
    assert longer.memq_usd == pytest.approx(cost_at(slower, 20_000.0, WEEK, P).memq_usd)
    shorter = dataclasses.replace(slower, seal=dataclasses.replace(slower.seal, batch_ms=ms * 0.95, max_batch_ms=ms * 0.95))
    assert dearer(shorter, 20_000.0) > 0                       # the least (to two digits) that breaks even
    text = "\n".join(describe(v))
    assert "break-even: 0.4 MiB/s (now 0.0191 MiB/s, 5% of it)" in text and "memq is the cheaper above it" in text and f"batch_ms={ms}" in text


def test_a_busy_topic_is_above_its_break_even_with_nothing_to_suggest() -> None:
    busy = measured("events", 40 * MiB, brokers=3)
    used = {"events": busy}
    v = verdict(busy, used, WEEK, P, estimate(busy, WEEK, P))
    assert v.above and v.suggestions == () and v.memq_usd < v.kafka_usd / 3
    assert v.break_even_bps == pytest.approx(break_even(shape_of(measured("quiet", 1000.0, brokers=3), used), WEEK, P))
    assert "memq is the cheaper now" in describe(v)[0]


def test_a_topic_in_a_storage_group_pays_its_share_and_a_lone_one_is_told_to_join() -> None:
    group = Seal(group="shared")
    busy = measured("events", 8 * MiB, seal=group)
    small = measured("clicks", 20_000.0, seal=group)
    alone = measured("audit", 20_000.0)                         # objects of its own (group "")
    used = {u.topic: u for u in (busy, small, alone)}
    shape = shape_of(small, used)
    assert shape.peers.bytes_per_s == 4 * MiB and shape.peers.batches_per_s == 4.0
    grouped_be, alone_be = break_even(shape, WEEK, P), break_even(shape_of(alone, used), WEEK, P)
    assert grouped_be is not None and alone_be is not None and grouped_be < alone_be / 10
    assert verdict(small, used, WEEK, P).above
    v = verdict(alone, used, WEEK, P)
    joined = next(s for s in v.suggestions if s.setting == "storage_group=shared")
    assert joined.cheaper and joined.memq_usd < v.kafka_usd < v.memq_usd
    assert joined.memq_usd == pytest.approx(cost_at(shape_of(alone, used, "shared"), 20_000.0, WEEK, P).memq_usd)


def test_a_topic_on_many_brokers_is_told_how_many_would_do() -> None:
    wide = measured("wide", 15_000.0, brokers=6, seal=Seal(batch_ms=10_000, max_batch_ms=10_000))
    v = verdict(wide, {"wide": wide}, WEEK, P)
    assert not v.above and [s.setting.split("=")[0] for s in v.suggestions] == ["brokers"]   # at its budget already
    (fewer,) = v.suggestions
    n = int(fewer.setting.removeprefix("brokers="))
    assert MIN_BROKERS <= n < 6 and fewer.cheaper
    shape = shape_of(wide, {"wide": wide})
    assert dearer(dataclasses.replace(shape, brokers=n + 1), 15_000.0) > 0 >= dearer(dataclasses.replace(shape, brokers=n), 15_000.0)


def test_break_even_is_none_when_memq_costs_more_per_byte_and_zero_when_it_never_does() -> None:
    shape = shape_of(measured("t", 1000.0), {})
    assert break_even(shape, WEEK, dataclasses.replace(P, s3_gb_month=1.0)) is None
    # free PUTs and large Messages (a batch per Message at a trickle): cheaper from the first byte
    large = shape_of(measured("t", 1000.0, message_bytes=50_000.0), {})
    assert break_even(large, WEEK, dataclasses.replace(P, s3_put_per_1000=0.0)) == 0.0
    v = verdict(measured("t", 1000.0), {}, WEEK, dataclasses.replace(P, s3_gb_month=1.0))
    assert v.break_even_bps is None and "dearer at any rate" in describe(v)[0]


def test_the_closed_form_is_where_the_model_last_crosses() -> None:
    """Against the model on a fine grid, for shapes with latency budgets, Message caps, peers,
    LIST costs and compaction: memq is dearer just below the break-even, never dearer above it."""
    rng = random.Random(7)
    for _ in range(60):
        batch_ms = rng.choice([50, 250, 1000])
        budget = rng.random() < 0.5
        seal = Seal(batch_bytes=rng.choice([1, 8]) * MiB, batch_ms=batch_ms,
                    min_batch_bytes=rng.choice([64 * 1024, MiB]) if budget else 0,
                    max_batch_ms=batch_ms * rng.choice([4, 40]) if budget else batch_ms)
        peers = Peers(rng.choice([0.0, 1000.0, MiB]), rng.choice([0.1, 4.0])) if rng.random() < 0.5 else Peers()
        shape = Shape("t", rng.randint(1, 4), seal, message_bytes=rng.choice([0.0, 100.0, 50_000.0]),
                      lists_per_s=rng.choice([0.0, 0.01]), peers=peers,
                      compacted=Compacted(10 * MiB, MiB) if rng.random() < 0.2 else None)
        be = break_even(shape, WEEK, P)
        grid = [10 ** (e / 20) for e in range(0, 200)]            # 1 B/s .. ~10 GB/s
        if be is None:
            assert dearer(shape, grid[-1]) > 0
            continue
        assert all(dearer(shape, b) <= 1e-9 for b in grid if b > be * 1.0001), (shape, be)
        if be > 0:
            assert dearer(shape, be * 0.9999) > 0, (shape, be)


def test_parse_metrics_reads_a_brokers_settings_and_usage_carries_them() -> None:
    text = """# TYPE memq_broker_start_time_seconds gauge
memq_broker_start_time_seconds 1000
# TYPE memq_broker_message_bytes_total counter
memq_broker_message_bytes_total{topic="demo"} 60000
# TYPE memq_broker_messages_total counter
memq_broker_messages_total{topic="demo"} 600
# TYPE memq_broker_topic_settings gauge
memq_broker_topic_settings{topic="demo",storage_group="shared",batch_bytes="8388608",batch_ms="250",min_batch_bytes="0",max_batch_ms="250",later="x"} 1
memq_broker_topic_settings{topic="idle",storage_group="",batch_ms="1000",batch_bytes="?"} 1
"""
    snaps = [parse_metrics(b, text, 1060.0) for b in ("b0", "b1")]
    assert snaps[0].settings["demo"] == Seal(8 * MiB, 250, 0, 250, "shared")
    used = usage(snaps)
    u, idle = used["demo"], used["idle"]         # hosted, nothing sealed yet: listed, with its settings
    assert idle.counts == TopicCounters() and idle.seal == Seal(batch_ms=1000) and idle.hosts == ("b0", "b1")
    assert u.seal == Seal(8 * MiB, 250, 0, 250, "shared") and u.hosts == ("b0", "b1")
    assert u.per_broker == {"b0": 1000.0, "b1": 1000.0} and u.counts.messages == 1200
    shown = report(["b0"], used, WEEK, P)["topics"]
    assert shown["idle"]["break_even"]["now_mib_s"] == 0 and shown["idle"]["break_even"]["break_even_mib_s"] > 0
    body = shown["demo"]["break_even"]
    assert body["now_mib_s"] == pytest.approx(2000 / MiB) and body["break_even_mib_s"] > body["now_mib_s"]
    assert body["method"] == "closed form" and body["suggestions"][0]["setting"].startswith("batch_ms=")


def test_a_broker_reports_the_settings_of_the_topics_it_hosts_and_withdraws_them() -> None:
    from prometheus_client import generate_latest

    from memq.broker.metrics import BrokerMetrics
    from memq.config import TopicConfig

    m = BrokerMetrics("b1")
    budget = TopicConfig("sensors", min_batch_bytes=MiB, max_batch_ms=10_000, storage_group="")
    m.hosted(budget)
    m.hosted(TopicConfig("demo"))
    seen = parse_metrics("b1", generate_latest(m.registry).decode(), 1.0).settings
    assert seen == {"demo": Seal(group="shared"), "sensors": Seal(min_batch_bytes=MiB, max_batch_ms=10_000)}
    m.unhosted(budget)
    m.unhosted(budget)                              # twice: nothing left to remove, no error
    assert list(parse_metrics("b1", generate_latest(m.registry).decode(), 1.0).settings) == ["demo"]
