"""What a front door may ask of the broker core: the one seam every door is built on.

Doors (memq's WebSocket produce and HTTP endpoints in `memq.broker.doors`, the Kafka listener
in `memq.kafka_api`) depend on this Protocol, never on `Broker`; the core never imports a door.
A door gets a topic's processor only through `admission` (memq.broker.admission).
"""

from __future__ import annotations

from typing import Protocol

from memq.config import MemqConfig
from memq.format.metadata import ClusterMetadata
from memq.schema.service import SchemaRegistry

from .admission import Admission
from .cluster_admin import ClusterAdmin
from .group.service import GroupCoordinator
from .guard import Guard
from .logs import Logs
from .metrics import BrokerMetrics
from .reads import Reads
from .share.service import Shares
from .txn.service import Transactions


class BrokerCore(Protocol):
    @property
    def broker_id(self) -> str: ...

    @property
    def config(self) -> MemqConfig: ...

    @property
    def metrics(self) -> BrokerMetrics: ...

    @property
    def guard(self) -> Guard:
        """Authentication and ACLs (SASL principals, describe filtering, denial counts)."""

    @property
    def admission(self) -> Admission:
        """The produce checks and quota charge, and the only way to append."""

    @property
    def reads(self) -> Reads:
        """The read path: notifications by partition and parts as Kafka batches, through the read cache."""

    @property
    def logs(self) -> Logs:
        """Partition logs: their log start, high watermark and segments (`memq.log.model`), fed from `reads`."""

    @property
    def group_coordinator(self) -> GroupCoordinator:
        """Kafka clients' consumer groups, KIP-848 and classic, coordinated here (memq.broker.group)."""

    @property
    def shares(self) -> Shares:
        """Share groups: the ones coordinated here, the share-partitions led here (memq.broker.share)."""

    @property
    def txns(self) -> Transactions:
        """Kafka transactions: the coordinator's calls and the transactional produce checks (memq.broker.txn)."""

    @property
    def schemas(self) -> SchemaRegistry:
        """The schema registry (memq.schema): the cluster's in ZooKeeper, this broker's alone without."""

    @property
    def cluster_admin(self) -> ClusterAdmin | None:
        """Topics and ACLs through ZooKeeper, as `memq topic` and `memq acl` change them (None
        without ZooKeeper: topics then come from the brokers' config files)."""

    @property
    def draining(self) -> bool:
        """Shutting down: doors refuse new connections."""

    def metadata(self) -> ClusterMetadata:
        """This broker's view of the cluster (its topics, overlaid with the governor's)."""

    def health(self) -> str | None:
        """None when this broker can take ack=all writes; otherwise why it cannot."""

    def hosted(self) -> list[str]:
        """The topics hosted here, sorted."""
