"""Kafka's wire protocol, sans I/O: the codec (`protocol`), Kafka -> memq mapping (`mapping`) and
when a quiet connection seals early (`idle_seal`). The asyncio door is `memq.broker.doors.kafka`."""
