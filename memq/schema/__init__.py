"""memq's schema registry.

Pure parts (no I/O): `model` (schemas, subjects' versions, Confluent's codes), one module of rules
per format (`avro`, `jsonschema_rules`) and `compat` (the seven compatibility modes). The store
behind a Protocol (`store`: ZooKeeper, and memory for unit tests) and the registry's operations
over it (`service`), which the broker's registry door (memq.broker.doors.schema_registry) serves.
"""
