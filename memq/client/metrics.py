"""Counters of one Producer (plain numbers, like ConsumerMetrics: a client has no metrics endpoint)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ProducerMetrics:
    """Throttle time is what brokers reported in acks (`Ack.throttle_ms`): how long a broker
    stopped reading this producer's connection because a byte-rate quota was exceeded (Kafka's
    produce-throttle-time). The producer is slowed, never failed, by it."""

    throttled_acks: int = 0
    throttle_ms_total: int = 0
    throttle_ms_max: int = 0

    def throttled(self, throttle_ms: int) -> None:
        """Count one ack's throttle time (0: not throttled)."""
        if throttle_ms:
            self.throttled_acks += 1
            self.throttle_ms_total += throttle_ms
            self.throttle_ms_max = max(self.throttle_ms_max, throttle_ms)
