"""Throughput around each fault: S3 requests per second before, during and after it, and how
long after the heal the producers' acks per second were back to their rate before it. No I/O.

A throttled S3 (the `slowdown` fault) must get fewer requests while it throttles, not more (a
retry storm), and the acks must come back at their usual rate soon after the heal. Request
rates come from the S3 fault proxy's running totals (`RequestCount`), ack rates from the
producers' acks; "before" and "after" are the `window_s` either side of the fault.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from memq.chaos.checker import AckEvent, FaultRow
from memq.chaos.s3faults import RequestCount

WINDOW_S = 10.0
NORMAL_SHARE = 0.9     # acks per second at least this share of the rate before the fault: back to normal


@dataclass(frozen=True)
class FaultThroughput:
    name: str
    s3_rps_before: float | None      # None: no proxy counts around then
    s3_rps_during: float | None
    s3_rps_after: float | None
    slowdown_share_during: float | None  # of the requests during the fault, answered 503 SlowDown
    acks_per_s_before: float
    acks_per_s_during: float
    back_to_normal_s: float | None   # heal -> start of the first 1 s with acks/s >= 90% of before; None: never
    failed: int                      # sends started in the fault that failed or never resolved
    acked_lost: int


def fault_throughput(row: FaultRow, acks: Sequence[AckEvent], counts: Sequence[RequestCount],
                     window_s: float = WINDOW_S) -> FaultThroughput:
    """The figures for one fault (`row`, from the checker's verdict); `counts` oldest first."""
    start, end = row.start_s, row.end_s
    ack_times = sorted(a.done_s for a in acks if a.ok)
    before = _count(ack_times, start - window_s, start) / window_s
    during = _count(ack_times, start, end) / max(end - start, 1e-9)
    during_counts = _delta(counts, start, end)
    return FaultThroughput(
        row.name, _rate(counts, start - window_s, start), _rate(counts, start, end), _rate(counts, end, end + window_s),
        None if during_counts is None or not during_counts[0] else round(during_counts[1] / during_counts[0], 3),
        round(before, 1), round(during, 1), _back_to_normal(ack_times, end, NORMAL_SHARE * before),
        row.failed, row.acked_lost)


def _count(times: Sequence[float], a: float, b: float) -> int:
    return bisect_left(times, b) - bisect_left(times, a)


def _back_to_normal(ack_times: Sequence[float], end: float, normal: float) -> float | None:
    """Seconds from `end` to the start of the first 1 s from which `normal` acks arrived."""
    last = ack_times[-1] if ack_times else end
    t = end
    while t <= last:
        if _count(ack_times, t, t + 1.0) >= normal:
            return round(t - end, 1)
        t += 0.1
    return None


def _delta(counts: Sequence[RequestCount], a: float, b: float) -> tuple[int, int, float] | None:
    """(requests, slowdowns, seconds) between the first sample at or after `a` and the last at or
    before `b`; None when fewer than two samples fall in [a, b]."""
    inside = [c for c in counts if a <= c.at_s <= b]
    if len(inside) < 2 or inside[-1].at_s <= inside[0].at_s:
        return None
    first, last = inside[0], inside[-1]
    return last.requests - first.requests, last.slowdowns - first.slowdowns, last.at_s - first.at_s


def _rate(counts: Sequence[RequestCount], a: float, b: float) -> float | None:
    d = _delta(counts, a, b)
    return None if d is None else round(d[0] / d[2], 1)
