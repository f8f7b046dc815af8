"""The nemesis schedule is a pure function of its seed, so a failing run can be replayed."""

from __future__ import annotations

import pytest

from memq.chaos.nemesis import KINDS, LONG_PAUSE_S, Fault, delayed_links, schedule
from memq.errors import ConfigError


def test_same_seed_same_schedule_and_faults_do_not_overlap() -> None:
    a = schedule(3, KINDS, total_s=300, brokers=["b1", "b2", "b3"])
    assert a == schedule(3, KINDS, total_s=300, brokers=["b1", "b2", "b3"])
    assert a != schedule(4, KINDS, total_s=300, brokers=["b1", "b2", "b3"])
    assert all(x.at_s + x.duration_s < y.at_s for x, y in zip(a, a[1:]))
    assert a[-1].at_s + a[-1].duration_s <= 300


def test_fixed_targets_and_unknown_kinds() -> None:
    faults = schedule(1, ["pause:s3", "kill-governor"], total_s=120, brokers=["b1"])
    assert {(f.kind, f.target) for f in faults} == {("pause", "s3"), ("kill-governor", "governor")}
    with pytest.raises(ConfigError, match="nope"):
        schedule(1, ["nope"], total_s=60, brokers=["b1"])


def test_delay_and_consumer_faults_pick_valid_targets() -> None:
    faults = schedule(5, ["delay", "kill-consumer"], total_s=600, brokers=["b1", "b2"])
    assert {f.kind for f in faults} == {"delay", "kill-consumer"}
    assert {f.target for f in faults if f.kind == "kill-consumer"} == {"consumer"}
    assert {f.target for f in faults if f.kind == "delay"} <= {"s3", "kafka", "zookeeper", "b1", "b2"}


def test_delayed_links_of_a_server_and_of_a_broker() -> None:
    assert delayed_links(Fault("delay", "kafka", 1.0, 5.0)) == ("kafka",)
    assert delayed_links(Fault("delay", "b2", 1.0, 5.0)) == ("s3", "kafka")   # the broker's links to both
    assert delayed_links(Fault("kill", "b2", 1.0, 5.0)) == ()


def test_fixed_target_must_exist() -> None:
    assert {f.target for f in schedule(1, ["delay:b2"], total_s=120, brokers=["b1", "b2"])} == {"b2"}
    with pytest.raises(ConfigError, match="'b9'"):
        schedule(1, ["delay:b9"], total_s=60, brokers=["b1", "b2"])
    with pytest.raises(ConfigError, match="'zookeeper'"):
        schedule(1, ["slow-s3:zookeeper"], total_s=60, brokers=["b1"])


def test_long_pauses_outlast_the_timeouts_and_overload_caps_s3() -> None:
    faults = schedule(2, ["long-pause", "overload"], total_s=600, brokers=["b1", "b2"])
    assert {f.kind for f in faults} == {"long-pause", "overload"}
    assert all(f.duration_s == LONG_PAUSE_S > 35 and f.target in ("s3", "kafka") for f in faults if f.kind == "long-pause")
    assert {f.target for f in faults if f.kind == "overload"} == {"s3"}
