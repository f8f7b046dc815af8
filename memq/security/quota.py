"""Produce byte-rate quotas: which rate applies, and how long to delay a request (pure: the
caller passes the clock).

A quota is a rate in bytes per second of Message bytes a broker receives, for a principal
(over all its topics) and for a topic (over all its principals), counted per broker as
Kafka's are. Each is a token bucket that may go into debt: a request is never refused, its
bytes are taken from its principal's and its topic's buckets, and the time until both are
out of debt is the throttle time, during which the broker reads nothing more from that
connection (Kafka's way: delay, never fail). Over any span the bytes accepted are at most
rate x span + one burst (`burst_s` of rate) + the request that went into debt.

One pause is at most `max_delay_s` (a connection not read for long misses its heartbeat and
its producer's request timeouts), and debt beyond it is forgiven rather than paid later: a
client whose single Messages are larger than rate x max_delay_s gets one per pause, more
than its quota, so keep `producer.max_message_bytes` under that product.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from memq.errors import ConfigError

#: The principal of a connection when security is off: per-topic quotas still apply, and a
#: principal default applies to every unauthenticated client together.
ANONYMOUS = "anonymous"


class QuotaSource(Protocol):
    """Where a broker looks quotas up, in bytes/s (None: no quota). `QuotaTable` serves the
    `[quota]` config; a ZooKeeper-backed store (a watch-updated cache, like the ACLs') can
    serve the same two lookups, and the broker picks up changed rates on the next request."""

    def principal_rate(self, principal: str) -> float | None: ...
    def topic_rate(self, topic: str) -> float | None: ...


def _rate(value: float) -> float | None:
    """0 means no quota."""
    return value or None


@dataclass(frozen=True)
class QuotaTable:
    """Defaults plus per-name overrides; an override of 0 exempts that name from the default."""

    principal_default: float = 0.0
    topic_default: float = 0.0
    principals: Mapping[str, float] = field(default_factory=dict)
    topics: Mapping[str, float] = field(default_factory=dict)

    def principal_rate(self, principal: str) -> float | None:
        return _rate(self.principals.get(principal, self.principal_default))

    def topic_rate(self, topic: str) -> float | None:
        return _rate(self.topics.get(topic, self.topic_default))


def parse_overrides(lines: Iterable[str], where: str) -> dict[str, float]:
    """`NAME=BYTES_PER_S` lines to a mapping; ConfigError naming `where[i]` and the line."""
    out: dict[str, float] = {}
    for i, line in enumerate(lines):
        name, sep, value = line.rpartition("=")
        name = name.strip()
        try:
            rate = float(value)
        except ValueError:
            rate = -1.0
        if not sep or not name or not rate >= 0 or rate == float("inf"):
            raise ConfigError(f"{where}[{i}]: {line!r} is not 'NAME=BYTES_PER_SECOND' "
                              "(a number >= 0; 0 = no quota)")
        if name in out:
            raise ConfigError(f"{where}[{i}]: {name!r} is given twice")
        out[name] = rate
    return out


class TokenBucket:
    """`rate` bytes/s refilling up to `rate * burst_s`; `charge` always takes the bytes and
    returns the seconds until the bucket is out of debt (0 when it is not in debt), keeping
    at most `max_delay_s` of debt."""

    def __init__(self, rate: float, burst_s: float, max_delay_s: float, now: float) -> None:
        self.rate = rate
        self.burst_s = burst_s
        self.max_delay_s = max_delay_s
        self.tokens = rate * burst_s
        self._at = now

    def set_rate(self, rate: float) -> None:
        """A changed quota: keep the debt, cap the credit at the new burst."""
        self.rate = rate
        self.tokens = min(self.tokens, rate * self.burst_s)

    def charge(self, nbytes: int, now: float) -> float:
        elapsed = max(now - self._at, 0.0)
        self._at = max(now, self._at)
        self.tokens = max(min(self.tokens + elapsed * self.rate, self.rate * self.burst_s) - nbytes,
                          -self.rate * self.max_delay_s)
        return -self.tokens / self.rate if self.tokens < 0 else 0.0


class Throttler:
    """The buckets of one broker: one per principal and per topic that has a quota."""

    def __init__(self, source: QuotaSource, *, burst_s: float, max_delay_s: float) -> None:
        self.source = source
        self._burst_s = burst_s
        self._max_delay_s = max_delay_s
        self._principals: dict[str, TokenBucket] = {}
        self._topics: dict[str, TokenBucket] = {}

    def charge(self, principal: str, topic: str, nbytes: int, now: float) -> float:
        """Account a request of `nbytes`; the seconds to stop reading its connection."""
        p_rate, t_rate = self.source.principal_rate(principal), self.source.topic_rate(topic)
        if p_rate is None and t_rate is None and not self._principals and not self._topics:
            return 0.0           # no quota anywhere: the common case, once per Message
        return max(self._charge(self._principals, principal, p_rate, nbytes, now),
                   self._charge(self._topics, topic, t_rate, nbytes, now))

    def _charge(self, buckets: dict[str, TokenBucket], name: str, rate: float | None, nbytes: int,
                now: float) -> float:
        if rate is None:
            buckets.pop(name, None)
            return 0.0
        bucket = buckets.get(name)
        if bucket is None:
            bucket = buckets[name] = TokenBucket(rate, self._burst_s, self._max_delay_s, now)
        elif bucket.rate != rate:
            bucket.set_rate(rate)
        return bucket.charge(nbytes, now)
