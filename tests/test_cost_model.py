"""The cost model and the counters behind it, on /metrics text of the real metric classes: pure, no servers."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from memq.broker.metrics import BrokerMetrics
from memq.compaction.run import CompactionMetrics
from memq.config import CostConfig, build, load_config
from memq.cost import TopicCounters, as_dict, estimate, kafka_lines, parse_metrics, request_class, usage
from memq.cost.counters import Compacted, Usage, compacted_of, kept
from memq.cost.model import GB, MONTH_S
from memq.errors import ConfigError, InvalidInputError
from memq.governor.governor import GovernorMetrics
from memq.storage.metrics import StorageMetrics, topic_of

KEY = "3f/dev/topics/orders/0001700000000000-b1-0a1b-a0"


def broker_text(puts: int = 10, *, topic: str = "orders", started: float = 1000.0) -> str:
    """/metrics of a broker that stored `puts` 1 MiB batches of `topic` (and did some other requests)."""
    m = BrokerMetrics("b1")
    m.started.set(started)
    s = StorageMetrics(m.registry)
    for _ in range(puts):
        m.bytes.labels(topic).inc(1 << 20)
        m.batch_bytes.labels(topic).observe(1 << 20)
        m.batches.labels(topic, "ok").inc()
        m.notification_bytes.labels(topic).inc(300)
        s.sent("s3", "put", f"s3://memq/{KEY.replace('orders', topic)}")
    m.batches.labels(topic, "STORAGE").inc()          # a failed batch is no notification
    s.sent("s3", "put", f"s3://memq/{KEY.replace('orders', topic)}")   # ... but its PUT is billed
    s.sent("s3", "get_range", KEY.replace("orders", topic))
    s.sent("s3", "list", f"s3://memq/3f/dev/topics/{topic}/")
    s.sent("s3", "delete_objects", f"s3://memq/{KEY.replace('orders', topic)}")
    s.sent("s3", "list", "s3://memq/")                 # names no topic: not priced per topic
    return generate_latest(m.registry).decode()


def test_topic_of_reads_keys_urls_and_listing_prefixes() -> None:
    assert topic_of(KEY) == "orders"
    assert topic_of(f"s3://bucket/{KEY}") == "orders"
    assert topic_of("ab/dev/topics/a.b-c_d/") == "a.b-c_d"
    assert topic_of("ab/topics/topics/t/x") == "t"       # a cluster named "topics"
    assert topic_of("s3://bucket/") == topic_of("2 keys") == ""


def test_request_classes_follow_s3_billing() -> None:
    assert [request_class(op) for op in ("put", "get", "get_range", "list", "delete", "delete_objects",
                                         "bulk_delete", "head")] == \
        ["put", "get", "get", "list", "delete", "delete", "delete", "get"]


def test_parse_metrics_counts_per_topic() -> None:
    snap = parse_metrics("b1", broker_text(10), taken_s=1100.0)
    assert (snap.broker, snap.started_s, set(snap.topics)) == ("b1", 1000.0, {"orders"})
    c = snap.topics["orders"]
    assert (c.bytes_in, c.objects, c.stored_bytes, c.notifications, c.notification_bytes) == \
        (10 << 20, 10, 10 << 20, 10, 3000)
    assert c.requests == {"put": 11, "get": 1, "list": 1, "delete": 1}


def test_a_scrape_without_the_start_time_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="no memq_broker_start_time_seconds"):
        parse_metrics("b9", generate_latest(CollectorRegistry()).decode(), taken_s=1.0)


def test_usage_since_start_and_over_a_window_sums_brokers() -> None:
    a0 = parse_metrics("b1", broker_text(10), taken_s=1100.0)
    a1 = parse_metrics("b1", broker_text(30), taken_s=1200.0)
    b1 = parse_metrics("b2", broker_text(5, started=1150.0), taken_s=1200.0)   # joined in the window
    since = usage([a1])["orders"]
    assert since.window_s == 200 and since.counts.requests["put"] == 31 and since.rates.objects == 30 / 200
    win = usage([a1, b1], before=[a0])["orders"]
    assert win.counts.objects == 20 + 5 and win.counts.requests["put"] == 20 + 6
    assert win.rates.objects == pytest.approx(20 / 100 + 5 / 50)
    restarted = parse_metrics("b1", broker_text(2, started=1190.0), taken_s=1200.0)   # counters reset
    assert usage([restarted], before=[a0])["orders"].counts.objects == 2


def test_the_estimate_prices_each_line_as_documented() -> None:
    p = CostConfig(consumer_read_path="s3")                    # the consumer reads S3 itself: a GET an object
    per_s = 10 * 1024 * 1024                                   # 10 MiB/s in, 8 MiB objects
    rates = TopicCounters(bytes_in=per_s, objects=per_s / (8 << 20), stored_bytes=per_s,
                          notifications=per_s / (8 << 20), notification_bytes=300 * per_s / (8 << 20),
                          requests={"put": per_s / (8 << 20), "get": 0.0, "list": 0.0, "delete": 0.0})
    e = estimate(Usage("t", 60.0, rates, rates), 7 * 86_400, p)
    m, k = e.memq, e.kafka
    puts = 1.25 * MONTH_S
    assert m.s3_put.quantity == pytest.approx(puts)
    assert m.s3_put.usd == pytest.approx(puts / 1000 * 0.005)
    assert m.s3_get_consumers.usd == pytest.approx(puts / 1000 * 0.0004)
    assert m.requests_usd == pytest.approx(puts / 1000 * (0.005 + 0.0004))
    stored_gb = per_s * 7 * 86_400 / GB
    assert m.s3_storage.usd == pytest.approx(stored_gb * 0.023)
    month_gb = per_s * MONTH_S / GB
    assert m.producer_transfer.usd == pytest.approx(month_gb * 2 / 3 * 0.02)
    assert k.storage.usd == pytest.approx(stored_gb * 3 * 0.08)
    assert k.replication.usd == pytest.approx(month_gb * 2 * 0.02)
    assert k.producer_transfer.usd == pytest.approx(month_gb * 2 / 3 * 0.02)
    assert k.consumer_transfer.usd == pytest.approx(month_gb * 2 / 3 * 0.02)
    assert e.kafka_usd == pytest.approx(sum(line.usd for line in k.lines)) and 0.8 < e.saving < 1.0   # MemQ's headline


def test_an_estimate_is_named_lines_that_json_and_labels_follow() -> None:
    """Programs (the benches, `--json` readers) pick a line by its field name, so a relabelled line
    cannot break them; people see the lines in field order with their labels."""
    p = build(CostConfig, {"consumer_groups": 3, "consumer_read_path": "s3"}, "cost")
    rates = TopicCounters(bytes_in=1000.0, objects=2.0, stored_bytes=1000.0,
                          requests={"put": 2.0, "get": 0.5, "list": 0.25, "delete": 0.0})
    u = Usage("t", 60.0, rates, rates)
    e = estimate(u, 86_400, p)
    assert e.memq.s3_get_consumers.quantity == pytest.approx(2.0 * 3 * MONTH_S)      # 3 groups x 2 objects/s
    # through brokers (the default): the consumers' GETs are the brokers' cache misses, counted on them
    via = estimate(u, 86_400, build(CostConfig, {"consumer_groups": 3}, "cost"))
    assert via.memq.s3_get_consumers.quantity == 0 and "through brokers" in via.memq.s3_get_consumers.item
    assert via.memq.s3_get_brokers.quantity == e.memq.s3_get_brokers.quantity
    assert e.memq.s3_get_brokers.quantity == pytest.approx(0.5 * MONTH_S)
    assert e.memq.lines[0] is e.memq.s3_put and e.kafka.lines[2] is e.kafka.replication
    assert e.memq_usd == pytest.approx(sum(line.usd for line in e.memq.lines))
    shown = as_dict(u, e)
    assert [x["name"] for x in shown["kafka"]] == ["storage", "producer_transfer", "replication", "consumer_transfer"]
    get = next(x for x in shown["memq"] if x["name"] == "s3_get_consumers")
    assert get["usd"] == pytest.approx(e.memq.s3_get_consumers.usd) and "3 consumer group(s)" in get["item"]


def test_tiny_objects_make_memq_dearer_than_kafka() -> None:
    """A trickle topic writing a PUT per second at 100 B/s: request charges dominate (why the
    latency budget exists)."""
    rates = TopicCounters(bytes_in=100.0, objects=1.0, stored_bytes=100.0,
                          requests={"put": 1.0, "get": 0.0, "list": 0.0, "delete": 0.0})
    e = estimate(Usage("t", 60.0, rates, rates), 7 * 86_400, CostConfig())
    assert e.memq_usd > e.kafka_usd and e.saving < 0


def test_kafka_model_follows_its_parameters() -> None:
    p = build(CostConfig, {"kafka_replicas": 1, "cross_az_fraction": 0, "kafka_disk_utilization": 0.5},
              "cost")
    bill = kafka_lines(GB / MONTH_S, MONTH_S, p)
    assert bill.storage.quantity == pytest.approx(2.0)            # 1 GB kept, half the disk free
    assert bill.producer_transfer.usd == bill.replication.usd == bill.consumer_transfer.usd == 0


def test_the_price_table_is_a_config_section() -> None:
    cfg = load_config(env={"MEMQ_COST_S3_PUT_PER_1000": "0.0054", "MEMQ_COST_CONSUMER_GROUPS": "3"})
    assert (cfg.cost.s3_put_per_1000, cfg.cost.consumer_groups, cfg.cost.s3_gb_month) == (0.0054, 3, 0.023)
    with pytest.raises(ConfigError, match=r"cost.kafka_disk_utilization = 1.5 is out of range"):
        load_config(env={"MEMQ_COST_KAFKA_DISK_UTILIZATION": "1.5"})


def test_the_output_names_which_prices_it_used() -> None:
    from memq.cost import price_source

    assert "S3 Standard" in price_source(CostConfig()) and "public list prices" in price_source(CostConfig())
    assert price_source(CostConfig(s3_gb_month=0.021)) == "the [cost] price table of the config"


def test_a_storage_groups_requests_are_split_over_its_topics_by_bytes() -> None:
    """One PUT of a shared object served three topics: each pays its share of the bytes."""
    m = BrokerMetrics("b1")
    m.started.set(1000.0)
    s = StorageMetrics(m.registry)
    for topic, nbytes in (("a", 600), ("b", 300), ("c", 100)):
        m.group_bytes.labels("g", topic).inc(nbytes)
        m.batch_bytes.labels(topic).observe(nbytes)
    for _ in range(10):
        s.sent("s3", "put", "s3://memq/3f/dev/groups/g/0001700000000000-b1-0a1b-a0")
    s.sent("s3", "list", "s3://memq/3f/dev/groups/g/")
    s.sent("s3", "list", "s3://memq/3f/dev/groups/nobody/")       # no bytes in that group: dropped
    snap = parse_metrics("b1", generate_latest(m.registry).decode(), taken_s=1100.0)
    assert set(snap.topics) == {"a", "b", "c"}
    assert {t: c.requests["put"] for t, c in snap.topics.items()} == pytest.approx({"a": 6, "b": 3, "c": 1})
    assert sum(c.requests["list"] for c in snap.topics.values()) == pytest.approx(1)
    assert snap.topics["a"].objects == 1                          # a part of an object is read by one GET


def compactor_text(parts: dict[str, float], ratios: dict[str, float], *, topic: str = "state") -> str:
    """/metrics of a broker whose compactor reports `topic`'s partitions, as memq.governor.agent
    registers them: the broker's, the governor's and the compactor's on one registry."""
    m = BrokerMetrics("gov")
    m.started.set(1000.0)
    m.batch_bytes.labels(topic).observe(1 << 20)
    GovernorMetrics(m.registry)
    c = CompactionMetrics(m.registry)
    for p, v in parts.items():
        c.stored.labels(topic, p).set(v)
    for p, v in ratios.items():
        c.dirty_ratio.labels(topic, p).set(v)
    return generate_latest(m.registry).decode()


def test_a_compacted_topic_keeps_its_parts_and_the_tail_its_dirty_ratio_implies() -> None:
    """ratio = tail / (parts + tail): 30 MiB of parts at ratio 0.25 carry a 10 MiB tail."""
    snap = parse_metrics("gov", compactor_text({"0": 30 << 20}, {"0": 0.25}), taken_s=1100.0)
    assert kept([snap]) == {"state": Compacted(30 << 20, 10 << 20)}
    assert kept([snap])["state"].kept_bytes == 40 << 20
    assert compacted_of({"0": 8.0, "1": 0.0}, {"0": 0.5, "1": 0.0}) == Compacted(8.0, 8.0)   # an empty partition
    # never compacted yet (no parts, ratio 1: the tail is unknown): priced as a plain topic
    assert kept([parse_metrics("gov", compactor_text({"0": 0.0}, {"0": 1.0}), taken_s=1100.0)]) == {}
    assert compacted_of({"0": 8.0, "1": 0.0}, {"0": 0.5, "1": 1.0}) is None
    assert parse_metrics("b1", broker_text(3), taken_s=1100.0).compaction == {}


def test_a_topics_partitions_compacted_by_different_brokers_add_up() -> None:
    """Each broker reports the partitions it compacts; during a move two report one partition,
    and the larger parts win until the former compactor drops its gauges."""
    a = parse_metrics("a", compactor_text({"0": 30 << 20}, {"0": 0.0}), taken_s=1100.0)
    b = parse_metrics("b", compactor_text({"1": 10 << 20, "2": 4 << 20}, {"1": 0.5, "2": 0.0}), taken_s=1100.0)
    assert usage([a, b])["state"].compacted == Compacted(44 << 20, 10 << 20)
    stale = parse_metrics("c", compactor_text({"0": 20 << 20}, {"0": 0.0}), taken_s=1100.0)
    assert usage([stale, a, b])["state"].compacted == Compacted(44 << 20, 10 << 20)
    assert usage([parse_metrics("b1", broker_text(3), taken_s=1100.0)])["orders"].compacted is None


def test_a_compacted_topic_is_priced_on_what_it_keeps_next_to_what_it_would_keep() -> None:
    p = CostConfig()
    per_s = 1 << 20                                             # 1 MiB/s written, kept 7 days plain
    rates = TopicCounters(bytes_in=per_s, objects=1.0, stored_bytes=per_s,
                          requests={"put": 1.0, "get": 0.0, "list": 0.0, "delete": 0.0})
    kept = Compacted(parts_bytes=3 * GB, tail_bytes=1 * GB)
    week = 7 * 86_400
    plain = estimate(Usage("t", 60.0, rates, rates), week, p)
    e = estimate(Usage("t", 60.0, rates, rates, kept), week, p)
    assert plain.compaction is None and as_dict(Usage("t", 60.0, rates, rates), plain)["compaction"] is None
    assert e.memq.s3_storage.quantity == pytest.approx(4.0) and e.memq.s3_storage.usd == pytest.approx(4 * 0.023)
    assert e.kafka.storage.quantity == pytest.approx(4.0 * 3)          # Kafka compacts too: 3 replicas of it
    c = e.compaction
    assert c is not None and c.uncompacted_bytes == pytest.approx(per_s * week)
    assert c.uncompacted_usd == pytest.approx(plain.memq.s3_storage.usd) and c.kept_usd == e.memq.s3_storage.usd
    assert c.saving_usd == pytest.approx(per_s * week / GB * 0.023 - 4 * 0.023) and c.saving_usd > 0
    assert plain.memq_usd - e.memq_usd == pytest.approx(c.saving_usd)   # memq's total moves by the saving
    shown = as_dict(Usage("t", 60.0, rates, rates, kept), e)["compaction"]
    assert shown["kept_bytes"] == 4 * GB and shown["tail_bytes"] == GB
    assert shown["saving_usd_month"] == pytest.approx(c.saving_usd)
    assert "(compacted parts + plain tail)" in e.memq.s3_storage.item
    assert c.describe().startswith("compacted: keeps 4,096.0 MiB (parts 3,072.0 + plain tail 1,024.0) where "
                                   "604,800.0 MiB would be kept") and "saves 13.49" in c.describe()
    # keys kept longer than the retention the view prices: compaction costs, and says so
    longer = estimate(Usage("t", 60.0, rates, rates, kept), 3_600, p).compaction
    assert longer is not None and longer.saving_usd < 0 and "costs" in longer.describe()
