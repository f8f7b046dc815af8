"""A short seeded chaos run across namespace hosts: no acked record lost, no dangling pointer;
the transactional workload commits all or nothing; a compacted topic keeps every key's latest
acked value. Soaks of a minute or more each: `python -m bench soak` runs them (`-m slow`), the
default suite does not.

Faults today's code survives: a broker SIGKILLed and restarted, a broker cut from ZooKeeper,
S3 paused. Replay a failure with the printed seed: `python -m bench chaos --seed S --kinds ...`
(`--reader kafka` for the Kafka consumer group's run).
"""

from __future__ import annotations

import pytest

from memq.chaos.run import RunSpec, run, table
from memq.chaos.topology import unavailable

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = 7


def test_short_seeded_run_loses_nothing() -> None:
    why = unavailable()
    if why:
        pytest.skip(f"chaos harness: {why}")
    spec = RunSpec(seed=SEED, seconds=55.0, kinds=("kill", "cut-zk", "pause:s3"), durations=(4.0, 8.0),
                   gap_s=(5.0, 8.0), rate=80.0)
    result = run(spec)
    report = table(result)
    print(report)
    v = result.verdict
    assert len(v.faults) == len(result.schedule) >= 3, report   # every fault applied and healed
    assert not result.nemesis_errors, report
    assert v.acked > 0.5 * v.sends, report
    assert v.passed, report
    assert all(f.heal_to_first_ack_s is not None for f in v.faults), report


def test_a_kafka_consumer_group_misses_nothing() -> None:
    """The workload read by a confluent-kafka consumer group through the brokers' Kafka
    listeners: brokers SIGKILLed under it and the group's consumer SIGKILLed and restarted, and
    the group still receives every acked record (again only what it had not committed)."""
    why = unavailable()
    if why:
        pytest.skip(f"chaos harness: {why}")
    spec = RunSpec(seed=SEED, seconds=32.0, kinds=("kill", "kill-consumer"), durations=(4.0, 6.0),
                   gap_s=(4.0, 6.0), rate=80.0, reader="kafka")
    result = run(spec)
    report = table(result)
    print(report)
    v = result.verdict
    assert {f.kind for f in result.schedule} == {"kill", "kill-consumer"}, report
    assert len(v.faults) == len(result.schedule) and not result.nemesis_errors, report
    assert v.acked > 0.5 * v.sends, report
    assert v.acked_lost == 0 and v.consumer_missed == 0 and v.passed, report
    assert v.duplicates < v.acked, report    # redelivery since the last commit, not a re-read from the start


def test_consumer_kill_and_delayed_links_lose_nothing() -> None:
    """The group's consumer SIGKILLed and restarted gets again only what it had not committed;
    delayed links to Kafka, to S3 and from one broker slow writes but lose none."""
    why = unavailable()
    if why:
        pytest.skip(f"chaos harness: {why}")
    spec = RunSpec(seed=SEED, seconds=100.0, kinds=("kill-consumer", "delay:kafka", "delay:s3", "delay:b1"),
                   durations=(6.0, 8.0), gap_s=(5.0, 8.0), rate=80.0)
    result = run(spec)
    report = table(result)
    print(report)
    v = result.verdict
    assert {f.kind for f in result.schedule} == {"kill-consumer", "delay"}, report
    assert len(v.faults) == len(result.schedule) and not result.nemesis_errors, report
    assert v.passed, report
    kills = [f for f in v.faults if f.name.startswith("kill-consumer")]
    assert sum(f.redelivered for f in kills) > 0, report     # the restart re-read uncommitted records
    assert v.duplicates < v.acked, report                    # ... not everything: it resumed from commits


def test_transactions_under_broker_kills_commit_all_or_nothing() -> None:
    """The transactional workload (memq's Producer, a fifth of its transactions aborted) with
    brokers SIGKILLed under it: no committed record lost, none of an aborted transaction visible
    (published, delivered or read), none torn, and a read_committed reader reading the topic
    afterwards gets every committed record once. Slow: ~2 minutes with the cluster's start."""
    why = unavailable()
    if why:
        pytest.skip(f"chaos harness: {why}")
    spec = RunSpec(seed=SEED, seconds=40.0, kinds=("kill",), durations=(4.0, 6.0), gap_s=(4.0, 6.0), rate=80.0,
                   workload="txn")
    result = run(spec)
    report = table(result)
    print(report)
    v, t = result.verdict, result.txn
    assert t is not None and len(v.faults) == len(result.schedule) >= 2 and not result.nemesis_errors, report
    assert t.committed > 0.5 * (t.committed + t.aborted + t.in_doubt) and t.aborted > 0, report
    assert v.acked_lost == 0 and v.consumer_missed == 0, report
    assert (t.aborted_visible, t.torn, t.read_missed, t.read_duplicates) == (0, 0, 0, 0), report
    assert result.passed, report


def test_a_compacted_topic_keeps_every_keys_latest_acked_value_under_kills_and_zookeeper_cuts() -> None:
    """The brokers compact the topic while brokers are SIGKILLed and cut from ZooKeeper (the
    manifest pointer's compare-and-set under a partition): read from earliest afterwards, every
    key's last record is its latest acked write (or one that may have been ordered after it), and
    the group reading the plain tail misses nothing. Slow: ~2 minutes with the cluster's start."""
    why = unavailable()
    if why:
        pytest.skip(f"chaos harness: {why}")
    spec = RunSpec(seed=SEED, seconds=40.0, kinds=("kill", "cut-zk"), durations=(4.0, 6.0), gap_s=(4.0, 6.0),
                   rate=80.0, workload="compacted")
    result = run(spec)
    report = table(result)
    print(report)
    v, c = result.verdict, result.compacted
    assert c is not None and len(v.faults) == len(result.schedule) >= 2 and not result.nemesis_errors, report
    assert c.keys >= 32 and result.manifests >= 1, report    # the workload's keys, each written many times; compacted
    assert v.acked_lost == 0 and v.consumer_missed == 0, report
    assert not c.lost and not c.unknown and result.passed, report
