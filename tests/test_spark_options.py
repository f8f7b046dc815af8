"""The memq Spark source's option parsing, task splitting and rate limiting (no Spark, no servers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memq.errors import ConfigError
from memq.storage import ObjectLocation
from spark_source.datasource import rate_limit
from spark_source.options import EARLIEST, LATEST, OffsetSpec, parse_options
from spark_source.plan import MIN_TASK_BYTES, TARGET_PARTITION_BYTES, BatchRef, Bounds, plan_tasks, split


@pytest.fixture(autouse=True)
def aws_chain(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """Credentials from the standard AWS chain (env), and no profile file of this machine."""
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.delenv("MEMQ_CONFIG", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    return monkeypatch


def test_without_s3_credentials_the_driver_says_where_to_put_them(aws_chain: pytest.MonkeyPatch) -> None:
    aws_chain.delenv("AWS_ACCESS_KEY_ID")
    aws_chain.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ConfigError, match="no S3 credentials.*memq.config.*s3.accessKeyId.*AWS_ACCESS_KEY_ID"):
        parse_options({"topic": "events", "kafka.bootstrap.servers": "127.0.0.1:1"})
    o = parse_options({"topic": "events", "s3.accessKeyId": "a", "s3.secretAccessKey": "b"})
    assert (o.config.s3.access_key_id, o.config.s3.secret_access_key) == ("a", "b")


def test_config_file_comes_from_memq_config_as_for_the_cli(aws_chain: pytest.MonkeyPatch, tmp_path: Path) -> None:
    aws_chain.delenv("AWS_ACCESS_KEY_ID")
    aws_chain.delenv("AWS_SECRET_ACCESS_KEY")
    path = tmp_path / "memq.toml"
    path.write_text('[s3]\naccess_key_id = "id"\nsecret_access_key = "sec"\nbucket = "fromfile"\n')
    aws_chain.setenv("MEMQ_CONFIG", str(path))
    o = parse_options({"topic": "events"})
    assert (o.config.s3.access_key_id, o.config.s3.bucket) == ("id", "fromfile")
    o = parse_options({"topic": "events", "s3.bucket": "opt"})   # options win over the file
    assert o.config.s3.bucket == "opt"


def test_defaults_and_connection_options() -> None:
    o = parse_options({"topic": "events", "kafka.bootstrap.servers": "127.0.0.1:1234",
                       "s3.endpoint": "http://127.0.0.1:5", "s3.bucket": "bk", "CLUSTER": "c1",
                       "kafka.request.timeout.ms": "1500", "s3.connectTimeoutMs": "250"})
    assert o.topic == "events" and o.mode == "notifications" and o.fail_on_data_loss
    assert o.notification_topic == "memq.c1.events"
    assert o.config.kafka.bootstrap_servers == "127.0.0.1:1234"
    assert o.config.kafka.request_timeout_ms == 1500
    assert o.config.s3.endpoint_url == "http://127.0.0.1:5" and o.config.s3.bucket == "bk"
    assert o.config.s3.connect_timeout_s == 0.25
    assert o.starting is None and o.ending == OffsetSpec("latest")


@pytest.mark.parametrize("options, named", [
    ({}, "topic"),
    ({"topic": "a b"}, "topic name"),
    ({"topic": "t", "startingOffsets": "oldest"}, "startingOffsets"),
    ({"topic": "t", "endingOffsets": "earliest"}, "endingOffsets"),
    ({"topic": "t", "startingOffsets": '{"other": {"0": 1}}'}, "startingOffsets"),
    ({"topic": "t", "startingOffsets": '{"0": "x"}'}, "startingOffsets"),
    ({"topic": "t", "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
    ({"topic": "t", "minPartitions": "two"}, "minPartitions"),
    ({"topic": "t", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
    ({"topic": "t", "mode": "scan"}, "mode"),
    ({"topic": "t", "startingTimestamp": "20", "endingTimestamp": "10"}, "endingTimestamp"),
    ({"topic": "t", "subscribe": "t"}, "subscribe"),
    ({"topic": "t", "memq.broker": "http://127.0.0.1:1"}, "memq.broker"),
])
def test_bad_options_name_the_option(options: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        parse_options(options)


def test_offsets_json_in_kafka_form_and_flat() -> None:
    o = parse_options({"topic": "t", "startingOffsets": '{"t": {"0": 5, "2": -2}}',
                       "endingOffsets": '{"0": 9, "1": -1}'})
    assert o.starting is not None
    assert o.starting.resolve(0, 2, 20, default=EARLIEST) == 5
    assert o.starting.resolve(2, 2, 20, default=LATEST) == 2      # -2 = earliest
    assert o.starting.resolve(1, 2, 20, default=EARLIEST) == 2    # unnamed -> default
    assert o.ending.resolve(0, 0, 20, default=LATEST) == 9
    assert o.ending.resolve(1, 0, 20, default=LATEST) == 20       # -1 = latest


def _ref(p: int, off: int, size: int) -> BatchRef:
    return BatchRef(p, off, ObjectLocation("b", f"k{p}-{off}"), size, 0, 10)


def test_split_keeps_order_and_balances_bytes() -> None:
    groups = [[_ref(0, i, 10) for i in range(8)], [_ref(1, i, 10) for i in range(2)]]
    one_each = split(groups, None)
    assert [len(p.refs) for p in one_each] == [8, 2]
    parts = split(groups, 5)
    assert sum(len(p.refs) for p in parts) == 10 and len(parts) == 5
    flat = [(r.partition, r.offset) for p in parts for r in p.refs]
    assert flat == [(0, i) for i in range(8)] + [(1, i) for i in range(2)]
    big = split([[_ref(0, i, TARGET_PARTITION_BYTES // 2) for i in range(6)]], None)
    assert [len(p.refs) for p in big] == [2, 2, 2]


def test_a_read_is_spread_by_bytes_over_every_core_in_tasks_worth_starting() -> None:
    mib = 1024 * 1024
    groups = [[_ref(p, i, 4 * mib) for i in range(5)] for p in range(4)]       # 80 MiB in 4 read partitions
    two = plan_tasks(groups, None, drop_duplicates=True, cores=2)
    assert [sum(r.size for r in t.refs) for t in two] == [40 * mib, 40 * mib]
    assert len(plan_tasks(groups, None, drop_duplicates=True, cores=16)) == 80 * mib // MIN_TASK_BYTES
    assert len(plan_tasks([[_ref(0, i, mib) for i in range(8)]], None, drop_duplicates=True, cores=16)) == 1
    assert len(plan_tasks(groups, 10, drop_duplicates=True, cores=2)) == 10   # minPartitions: at least that
    assert len(plan_tasks(groups, None, drop_duplicates=False, cores=2)) == 4  # a task per read partition at least


def test_bounds_prune_by_partition_offset_and_time() -> None:
    b = Bounds(partitions=frozenset({1}), min_offset=3, max_offset=4, start_ms=5, end_ms=11)
    assert b.keeps(_ref(1, 3, 1)) and b.keeps(_ref(1, 4, 1))
    assert not b.keeps(_ref(0, 3, 1)) and not b.keeps(_ref(1, 5, 1)) and not b.keeps(_ref(1, 2, 1))
    assert not Bounds(start_ms=11).keeps(_ref(0, 0, 1))
    assert not Bounds(end_ms=0).keeps(_ref(0, 0, 1))
    assert Bounds(end_ms=1).keeps(_ref(0, 0, 1))


def test_rate_limit_shares_fairly_and_never_exceeds() -> None:
    start = {0: 0, 1: 10, 2: 5}
    latest = {0: 100, 1: 11, 2: 5}
    end = rate_limit(start, latest, 10)
    assert sum(end[p] - start[p] for p in start) == 10
    assert end == {0: 9, 1: 11, 2: 5}
    assert rate_limit(start, latest, 1000) == latest
