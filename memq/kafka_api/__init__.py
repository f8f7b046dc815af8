"""Kafka wire-protocol listener: any Kafka producer writes into memq topics unchanged."""
