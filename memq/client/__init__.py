"""memq.client: the async Producer and the polling Consumer."""

from memq.client.consumer import Consumer, ConsumerMetrics, ConsumerRecord

__all__ = ["Consumer", "ConsumerMetrics", "ConsumerRecord"]
