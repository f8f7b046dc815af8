"""Real local infrastructure for `memq dev` and the tests: moto S3, tansu Kafka, ZooKeeper."""

from memq.devcluster.cluster import DevCluster

__all__ = ["DevCluster"]
