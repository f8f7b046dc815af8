"""memq's coordinator of Kafka consumer groups: KIP-848 consumer groups and classic ones, their offsets."""
