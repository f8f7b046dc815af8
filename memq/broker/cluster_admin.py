"""Cluster administration a broker does on a client's behalf: topics and ACLs, through ZooKeeper.

One implementation behind every door that administers the cluster (the HTTP admin API that
`memq topic` and `memq acl` use, and Kafka's admin calls), so Kafka's tools see the cluster
memq's own tools see: the same governor placement, checks and ACL store. The caller checks the
principal's rights first; these calls run the blocking ZooKeeper and Kafka work in a thread.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from memq.config import MemqConfig, TopicConfig
from memq.governor.registry import Registry
from memq.governor.security_store import SecurityStore
from memq.governor.topics import TopicManager, check_partitions
from memq.security.tls import client_context

#: How long a topic creation waits for the governor to place it and its brokers to serve it.
PLACEMENT_TIMEOUT_S = 60.0


class ClusterAdmin:
    """Topics (TopicManager: ZooKeeper + the notification topic) and the stored ACLs and tokens."""

    def __init__(self, registry: Registry, config: MemqConfig) -> None:
        from memq.notify import TopicAdmin

        self.registry = registry
        self.config = config
        self.topics = TopicManager(registry, TopicAdmin(config.kafka), config.cluster.name)
        self.security = SecurityStore(registry)
        self.lists = self.security.lists()
        ca = config.producer.tls_ca_file       # verifies https peers while waiting for placement
        self._trust: ssl.SSLContext | None = client_context(ca) if ca else None

    async def create_topic(self, cfg: TopicConfig, *, validate_only: bool = False,
                           timeout_s: float = PLACEMENT_TIMEOUT_S) -> tuple[str, ...]:
        """Create `cfg` (a no-op if it exists with the same settings) and wait until placed: the
        brokers serving it. `validate_only`: only the checks creation would make, nothing changed."""
        if validate_only:
            def check() -> tuple[str, ...]:
                cfg.check_byte_retention()
                check_partitions(self.topics.kafka, cfg, self.topics.cluster, governed=True)
                return ()
            return await asyncio.to_thread(check)
        return await asyncio.to_thread(self.topics.ensure, cfg, timeout_s, self._trust)

    async def topic(self, name: str) -> TopicConfig:
        """The stored settings of `name` (UnknownTopicError if there is none)."""
        return await asyncio.to_thread(self.registry.topic, name)

    async def alter_topic(self, name: str, **changes: Any) -> TopicConfig:
        return await asyncio.to_thread(lambda: self.topics.alter(name, **changes))

    async def delete_topic(self, name: str, *, notifications: bool = False) -> None:
        await asyncio.to_thread(lambda: self.topics.delete(name, delete_notifications=notifications))

    async def rules(self) -> list[str]:
        """The stored ACL rules (the config file's are in `config.security.acls`)."""
        return await asyncio.to_thread(self.lists.rules)

    async def add_rule(self, rule: str) -> bool:
        return await asyncio.to_thread(self.lists.add_rule, rule)

    async def remove_rule(self, rule: str) -> int:
        return await asyncio.to_thread(self.lists.remove_rule, rule)

    async def add_token(self, entry: str) -> None:
        await asyncio.to_thread(self.lists.add_token, entry)

    async def revoke(self, principal: str) -> int:
        return await asyncio.to_thread(self.lists.revoke, principal)
