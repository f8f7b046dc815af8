"""memq: a MemQ-style PubSub. Brokers write batches of messages as immutable objects to S3
and publish pointers to them on Kafka; consumers and Spark read the objects straight from S3."""

__version__ = "0.1.0"
