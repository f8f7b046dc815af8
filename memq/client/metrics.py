"""Counters of one Producer or Consumer (plain numbers: a client has no metrics endpoint)."""

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


@dataclass
class ConsumerMetrics:
    """Counters of one Consumer, kept by its parts (handover, policy, commits) as they act."""

    records: int = 0
    batches: int = 0
    bytes: int = 0
    duplicates_dropped: int = 0        # LogMessages of dropped duplicate Messages
    duplicate_messages: int = 0        # Messages dropped as duplicates
    data_loss_skipped: int = 0
    expired: int = 0                   # notifications and objects past retention, skipped (never "lost")
    offset_resets: int = 0             # positions outside the retained notifications, reset
    commits: int = 0
    # which way parts came (memq.client.read_path): counted on the fetch loop's thread alone
    parts_via_broker: int = 0          # parts a broker served (from its read cache or one GET of its own)
    parts_via_s3: int = 0              # parts GET from storage by this consumer (far behind, or fallen back)
    broker_bytes: int = 0              # part bytes brokers served
    broker_fallbacks: int = 0          # broker reads that went to storage: no broker answered in time, or damaged
    broker_corrupt: int = 0            # parts a broker served that did not match their notification
