"""The link to the notification Kafka's group coordinator, where memq's own Consumer keeps its
groups (and where Kafka clients' groups were relayed before memq coordinated them: `group.legacy`
reads their offsets from there once).

`Groups.link()` gives a caller its own upstream link: its requests go to the coordinator in
order over one connection. A link finds the coordinator of a group on the notification Kafka
(FindCoordinator) and reconnects after any failure. Users: a transaction's commit of a memq
Consumer group's offsets (`txn.relay`), the migration's read (`group.legacy`).
"""

from __future__ import annotations

import asyncio
import itertools
import struct

from memq.errors import NotifyError, ProtocolError
from memq.kafka_api.groups import decode_find_coordinator_response, find_coordinator_request, mapped_group

_SIZE = struct.Struct(">i")
TIMEOUT_S = 30.0   # an OffsetCommit or OffsetFetch answers at once
CONNECT_TIMEOUT_S = 10.0
MAX_RESPONSE = 64 * 1024 * 1024


class Groups:
    def __init__(self, bootstrap_servers: str, cluster: str, broker_id: str) -> None:
        self._bootstrap = [s.strip() for s in bootstrap_servers.split(",") if s.strip()]
        self.cluster = cluster
        self._client_id = f"memq-broker-{broker_id}-groups"

    def mapped(self, group: str) -> str:
        return mapped_group(self.cluster, group)

    def link(self) -> GroupLink:
        return GroupLink(self)

    async def coordinator(self, group: str) -> tuple[str, int]:
        """(host, port) of the notification Kafka's coordinator of (mapped) `group`."""
        last: Exception | None = None
        for server in self._bootstrap:
            host, _, port = server.rpartition(":")
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError, ValueError) as e:
                last = e
                continue
            try:
                writer.write(find_coordinator_request(1, group, self._client_id))
                frame = await asyncio.wait_for(_read_frame(reader), CONNECT_TIMEOUT_S)
                error, chost, cport = decode_find_coordinator_response(frame)
                if error:
                    raise NotifyError(f"Kafka at {server} has no coordinator for group {group!r} (error {error})")
                return chost, cport
            except (OSError, TimeoutError, ProtocolError, asyncio.IncompleteReadError) as e:
                last = e
            finally:
                writer.close()
        raise NotifyError(f"no group coordinator for {group!r} on Kafka {','.join(self._bootstrap)}: {last}")


class GroupLink:
    """One door connection's relay to group coordinators."""

    def __init__(self, groups: Groups) -> None:
        self._groups = groups
        self._conns: dict[str, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        self._lock = asyncio.Lock()
        self._ids = itertools.count(1)

    async def relay(self, group: str, request: bytes) -> bytes:
        """Send the size-prefixed `request` (already naming the mapped `group`) to its coordinator;
        its response frame, size prefix included. NotifyError when Kafka cannot be reached."""
        async with self._lock:
            try:
                reader, writer = await self._conn(group)
                writer.write(request)
                frame = await asyncio.wait_for(_read_frame(reader), TIMEOUT_S)
            except (OSError, TimeoutError, ProtocolError, asyncio.IncompleteReadError) as e:
                self._drop(group)
                raise NotifyError(f"relaying to the coordinator of group {group!r}: {e}") from None
            return _SIZE.pack(len(frame)) + frame

    async def _conn(self, group: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        conn = self._conns.get(group)
        if conn is None:
            host, port = await self._groups.coordinator(group)
            conn = self._conns[group] = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)
        return conn

    def _drop(self, group: str) -> None:
        conn = self._conns.pop(group, None)
        if conn is not None:
            conn[1].close()

    def close(self) -> None:
        for group in list(self._conns):
            self._drop(group)


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = _SIZE.unpack(await reader.readexactly(4))
    if not 0 < size <= MAX_RESPONSE:
        raise ProtocolError(f"Kafka response of {size} bytes")
    return await reader.readexactly(size)
