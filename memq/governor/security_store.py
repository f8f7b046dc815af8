"""Tokens and ACLs in ZooKeeper: the znode `<zookeeper.root>/<cluster>/security`.

It holds one `StoredSecurity` JSON document. `edit` is a compare-and-set loop on the znode's
version, so two admins editing at once both land; `watch` calls back with every new version
(kazoo's DataWatch re-arms itself, also across session loss), which is how brokers apply a
change without a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from memq.errors import ConfigError, CoordinationError
from memq.security.stored import Change, SecurityLists, StoredSecurity

from .registry import Registry

log = logging.getLogger(__name__)

EDIT_ATTEMPTS = 20


class SecurityStore:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.path = f"{registry.base}/security"

    def read(self) -> tuple[StoredSecurity, int]:
        """The stored document and the znode version (-1: no znode yet)."""
        try:
            data, stat = self.registry._wait(self.registry.client.get_async(self.path), self.path)
        except NoNodeError:
            return StoredSecurity(), -1
        return StoredSecurity.from_json(bytes(data or b""), f"ZooKeeper {self.path}"), stat.version

    def edit(self, key: str, change: Change) -> tuple[list[str], list[str]]:
        """Replace list `key` ("tokens" or "acls") by `change(old)`; (old, new) of the write that
        landed (none when they are equal). `change` runs again when another edit lands in
        between, on that one's result."""
        client = self.registry.client
        for _ in range(EDIT_ATTEMPTS):
            current, version = self.read()
            new = current.edited(key, change)
            before, after = list(getattr(current, key)), list(getattr(new, key))
            if before == after:
                return before, after
            try:
                if version < 0:
                    self.registry._wait(client.create_async(self.path, new.to_json(), makepath=True), self.path)
                else:
                    self.registry._wait(client.set_async(self.path, new.to_json(), version=version), self.path)
                return before, after
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue     # someone else wrote first: apply the change to theirs
        raise CoordinationError(f"ZooKeeper {self.path}: {EDIT_ATTEMPTS} concurrent edits in a row, try again")

    def lists(self) -> SecurityLists:
        """Token and ACL administration on this store."""
        return SecurityLists(self.edit, f"ZooKeeper {self.path}")

    def watch(self, apply: Callable[[StoredSecurity], None]) -> None:
        """Call `apply` with the stored document now (before returning) and after every change,
        from kazoo's thread. A document that does not parse is logged and skipped: the last good
        one stays in force."""
        def changed(data: bytes | None, _stat: object) -> None:
            try:
                apply(StoredSecurity.from_json(data, f"ZooKeeper {self.path}"))
            except ConfigError as e:
                log.error("keeping the previous tokens and ACLs: %s", e)
        self.registry.client.DataWatch(self.path, changed)
