"""Throughput around a fault: S3 requests per second before, during and after it, and the time
from the heal until acks per second are back to normal, so a SlowDown storm's measurement shows
a retry storm (more requests while throttled) and a slow recovery when they happen."""

from __future__ import annotations

from memq.chaos.checker import AckEvent, FaultRow
from memq.chaos.s3faults import RequestCount
from memq.chaos.throughput import fault_throughput

STORM = FaultRow("slowdown:s3 20s", 100.0, 120.0, sends=0, failed=2, acked_lost=0, heal_to_first_ack_s=0.1,
                 max_write_gap_s=1.0, redelivered=0)


def _counts(rps: dict[range, tuple[int, int]]) -> list[RequestCount]:
    """A sample a second; in each second of a range, (requests, of them SlowDown) more."""
    out, requests, slowdowns = [], 0, 0
    for t in range(80, 141):
        out.append(RequestCount(float(t), requests, slowdowns))
        r, s = next((v for span, v in rps.items() if t in span), (0, 0))
        requests, slowdowns = requests + r, slowdowns + s
    return out


def _acks(per_s: dict[range, int]) -> list[AckEvent]:
    return [AckEvent("p0", f"{t}-{i}", t, t + i / n, True)
            for span, n in per_s.items() for t in span for i in range(n)]


def test_a_storm_with_fewer_requests_and_a_quick_recovery() -> None:
    counts = _counts({range(80, 100): (50, 0), range(100, 120): (20, 6), range(120, 141): (50, 0)})
    acks = _acks({range(80, 100): 200, range(100, 120): 100, range(120, 123): 100, range(123, 141): 200})
    f = fault_throughput(STORM, acks, counts)
    assert (f.s3_rps_before, f.s3_rps_during, f.s3_rps_after) == (50.0, 20.0, 50.0)
    assert f.slowdown_share_during == 0.3
    assert (f.acks_per_s_before, f.acks_per_s_during) == (200.0, 100.0)
    assert f.back_to_normal_s is not None and 2.5 <= f.back_to_normal_s <= 3.0   # a sliding 1 s window
    assert (f.failed, f.acked_lost) == (2, 0)


def test_a_retry_storm_and_no_recovery_show() -> None:
    counts = _counts({range(80, 100): (50, 0), range(100, 141): (150, 45)})
    acks = _acks({range(80, 100): 200, range(100, 141): 50})
    f = fault_throughput(STORM, acks, counts)
    assert f.s3_rps_during is not None and f.s3_rps_before is not None and f.s3_rps_during > f.s3_rps_before
    assert f.back_to_normal_s is None


def test_without_proxy_counts_request_rates_are_unknown() -> None:
    f = fault_throughput(STORM, _acks({range(80, 141): 10}), [])
    assert (f.s3_rps_before, f.s3_rps_during, f.s3_rps_after, f.slowdown_share_during) == (None,) * 4
    assert f.back_to_normal_s == 0.0
