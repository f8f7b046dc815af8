"""The memq Spark source's connection options for a memq config (its Kafka and S3)."""

from __future__ import annotations

from memq.config import MemqConfig


def connection(config: MemqConfig) -> dict[str, str]:
    """`spark.read.format("memq").options(**connection(config))` reads `config`'s cluster."""
    return {"kafka.bootstrap.servers": config.kafka.bootstrap_servers, "cluster": config.cluster.name,
            "s3.endpoint": config.s3.endpoint_url or "", "s3.bucket": config.s3.bucket,
            "s3.region": config.s3.region, "s3.accessKeyId": config.s3.access_key_id or "",
            "s3.secretAccessKey": config.s3.secret_access_key or "", "kafka.request.timeout.ms": "10000"}
