"""Kafka transactions on memq: the pure state machine, its stores, the broker's `Transactions` service."""
