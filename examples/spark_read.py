"""Read a memq topic with Spark, as a table and as a stream.

    python examples/spark_read.py http://127.0.0.1:8080 events

The broker URL is only used to discover Kafka and S3 (GET /v1/metadata); give
`kafka.bootstrap.servers` and `s3.endpoint`/`s3.bucket` options instead to skip it.
"""

import sys

from pyspark.sql import functions as F

from spark_source import local_session   # or: spark_source.register(your_session)

broker, topic = sys.argv[1], sys.argv[2]
spark = local_session("memq-example")

# Batch: everything in the topic now, or a time window (ms since the epoch).
df = (spark.read.format("memq")
      .option("memq.broker", broker)
      .option("topic", topic)
      .option("startingOffsets", "earliest")     # or '{"events": {"0": 42, "1": -2}}'
      .load())
df.groupBy("partition").agg(F.count("*").alias("messages"), F.max("timestamp").alias("newest")).show()
df.select(F.col("key").cast("string"), F.col("value").cast("string"), "headers").show(5, truncate=False)

# Streaming: each run picks up exactly what arrived since the last one (offsets in the checkpoint).
query = (spark.readStream.format("memq")
         .option("memq.broker", broker)
         .option("topic", topic)
         .option("startingOffsets", "earliest")
         .option("maxOffsetsPerTrigger", "100")   # batch objects per micro-batch
         .load()
         .writeStream.format("parquet")
         .option("path", f"/tmp/memq-{topic}/data")
         .option("checkpointLocation", f"/tmp/memq-{topic}/checkpoint")
         .trigger(availableNow=True)
         .start())
query.awaitTermination()
spark.stop()
