"""A short seeded chaos run across namespace hosts: no acked record lost, no dangling pointer.

Faults today's code survives: a broker SIGKILLed and restarted, a broker cut from ZooKeeper,
S3 paused. Replay a failure with the printed seed: `python -m bench chaos --seed S --kinds ...`.
"""

from __future__ import annotations

import pytest

from memq.chaos.run import RunSpec, run, table
from memq.chaos.topology import unavailable

pytestmark = pytest.mark.integration

SEED = 7


def test_short_seeded_run_loses_nothing() -> None:
    why = unavailable()
    if why:
        pytest.skip(f"chaos harness: {why}")
    spec = RunSpec(seed=SEED, seconds=75.0, kinds=("kill", "cut-zk", "pause:s3"), durations=(4.0, 8.0),
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
