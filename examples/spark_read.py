"""Read a memq topic with Spark, as a table and as a stream.

    python examples/spark_read.py .memq-run/dev/memq.toml demo     # against `memq dev`

The memq config file (`memq dev` writes this one) names the brokers, whose /v1/metadata gives
Kafka and S3, and holds the S3 credentials (metadata never carries them). Without a file, use
options `memq.broker`, `s3.accessKeyId`/`s3.secretAccessKey` or the AWS chain (AWS_PROFILE, ...).
"""

import sys

from pyspark.sql import functions as F

from spark_source import local_session   # or: spark_source.register(your_session)

config, topic = sys.argv[1], sys.argv[2]
spark = local_session("memq-example")

# Batch: everything in the topic now, or a time window (ms since the epoch).
df = (spark.read.format("memq")
      .option("memq.config", config)
      .option("topic", topic)
      .option("startingOffsets", "earliest")     # or '{"events": {"0": 42, "1": -2}}'
      .load())
df.groupBy("partition").agg(F.count("*").alias("messages"), F.max("timestamp").alias("newest")).show()
df.select(F.col("key").cast("string"), F.col("value").cast("string"), "headers").show(5, truncate=False)

# Streaming: each run picks up exactly what arrived since the last one (offsets in the checkpoint).
query = (spark.readStream.format("memq")
         .option("memq.config", config)
         .option("topic", topic)
         .option("startingOffsets", "earliest")
         .option("maxOffsetsPerTrigger", "100")   # batch objects per micro-batch
         .load()
         .writeStream.format("parquet")
         .option("path", f"memq-{topic}-stream/data")                  # under the working directory
         .option("checkpointLocation", f"memq-{topic}-stream/checkpoint")
         .trigger(availableNow=True)
         .start())
query.awaitTermination()
spark.stop()
