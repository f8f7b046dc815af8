"""The broker's watch on the cluster's stored tokens and ACLs (ZooKeeper).

With `security.enabled` and `zookeeper.enabled`, a broker process reads the stored tokens and
ACLs before it listens (so a stored token works from its first request) and applies every
change as it lands: a new rule or token on the next request, a removed rule on the next
request, a revoked token on the next connection (an open connection was authenticated when
it opened). It uses its own ZooKeeper session, independent of the governor agent's.
"""

from __future__ import annotations

from memq.config import MemqConfig
from memq.governor.registry import Registry
from memq.governor.security_store import SecurityStore

from .guard import Guard


def watch_stored_security(guard: Guard, config: MemqConfig) -> Registry | None:
    """Keep `guard` in step with the stored tokens and ACLs; the registry to close at the end,
    None when there is nothing to watch (security off, or no ZooKeeper)."""
    if not (config.security.enabled and config.zookeeper.enabled):
        return None
    registry = Registry(config.zookeeper, config.cluster.name).start()
    try:
        SecurityStore(registry).watch(guard.use_stored)
    except BaseException:
        registry.close()
        raise
    return registry
