"""A partition's log as every reader sees it: one read model (`model`, pure), fed by one place per side.

Three readers used to work out where a partition starts, where it ends and what to read from an
offset, each on its own (the Kafka door's Fetch, memq's Consumer, Spark's source). They now ask
`model.PartitionLog`, built from the facts each side reads with its own I/O:
- the broker (Fetch, ListOffsets, OffsetForLeaderEpoch, DeleteRecords): `memq.broker.logs.Logs`,
  over the core's read path (`Reads`: the notification tails, the manifests);
- memq's Consumer: the manifest through its `ManifestPointers` (`memq.client.compacted`), the
  DeleteRecords start from the cluster metadata;
- Spark's driver: the manifests through ZooKeeper (`spark_source.compacted.Prefixes`) and the
  notification watermarks.
The model holds the offset scheme (a record's offset <-> its notification and index) behind one
seam (`model.offset_of`, `position_of`, `start_of`, `end_of`), so a change of scheme is one change here.
"""
