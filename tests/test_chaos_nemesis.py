"""The nemesis schedule is a pure function of its seed, so a failing run can be replayed."""

from __future__ import annotations

import pytest

from memq.chaos.nemesis import KINDS, schedule
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
