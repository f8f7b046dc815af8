"""Real local infrastructure for `memq dev` and the tests: moto S3, tansu Kafka, ZooKeeper,
and governed broker processes on them."""

from memq.devcluster.cluster import DevCluster
from memq.devcluster.governed import BrokerHost, GovernedCluster

__all__ = ["BrokerHost", "DevCluster", "GovernedCluster"]
