"""`GET /v1/read`: a part's bytes for memq's own Consumer, through the broker's read cache.

`?topic=T&bucket=B&key=K&offset=O&size=S` answers bytes [O, O + S) of object B/K, a part of
topic T, from the same hot-object cache and single flight the Kafka Fetch uses
(`Reads.part_range`): the part this broker stored, or one ranged GET however many consumers
and groups ask. Plain HTTP/1.1 with keep-alive: one request at a time per connection, so a
client's connection pool bounds its concurrency here (DECISIONS: over a WebSocket of our own,
multiplexing would be ours to build and gained nothing measurable on loopback).

Reading needs the `consume` ACL on T, as the Kafka door's Fetch does: 403 with the reason,
which the client raises (never a silent fallback to S3). The object must be T's: its key under
T's own directory or its storage group's, in the cluster's bucket, the same scope a bucket
policy draws; anything else is 404 and the client reads storage itself. Bounded: at most
`MAX_READ_BYTES` a request, `MAX_READS` in flight on this broker (503 beyond, at once), each
read within `READ_TIMEOUT_S` (503). The client checks every byte against the notification.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from memq.errors import InvalidInputError, ObjectNotFoundError, StorageError
from memq.security.acl import Operation
from memq.storage import ObjectLocation
from memq.storage.naming import parse_key

from ..guard import PRINCIPAL_KEY
from ..seam import BrokerCore

log = logging.getLogger(__name__)

READ_PATH = "/v1/read"
MAX_READ_BYTES = 64 * 1024 * 1024   # the largest part a batch holds is far below (broker.max_batch_bytes)
MAX_READS = 256                     # reads in flight on this broker; beyond, 503 and the client reads S3
READ_TIMEOUT_S = 10.0               # the client gives up sooner (consumer.broker_read_timeout_ms)


class ReadDoor:
    def __init__(self, core: BrokerCore, app: web.Application) -> None:
        self._core = core
        self._in_flight = 0
        app.add_routes([web.get(READ_PATH, self._read)])

    def _answer(self, result: str, status: int, why: str) -> web.Response:
        self._core.metrics.part_reads.labels(result).inc()
        return web.json_response({"type": result, "error": why}, status=status)

    async def _read(self, request: web.Request) -> web.StreamResponse:
        core = self._core
        try:
            topic, loc, offset, size = self._parse(request)
        except InvalidInputError as e:
            return self._answer("bad_request", 400, str(e))
        principal = request.get(PRINCIPAL_KEY)
        if not core.guard.may(principal, Operation.CONSUME, topic):
            core.guard.count_denial(Operation.CONSUME)
            return self._answer("refused", 403, f"principal {principal} may not consume topic {topic}: e.g. "
                                f"memq acl add allow {principal} consume literal:{topic}")
        why = self._not_its(topic, loc)
        if why is not None:
            return self._answer("not_served", 404, why)
        if core.draining or self._in_flight >= MAX_READS:
            return self._answer("busy", 503, f"broker {core.broker_id} is "
                                f"{'shutting down' if core.draining else 'at its limit of reads'}")
        self._in_flight += 1
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                data = await core.reads.part_range(topic, loc, offset, size)
        except ObjectNotFoundError as e:
            return self._answer("missing", 404, str(e))
        except (StorageError, TimeoutError) as e:
            log.warning("reading %s @%d+%d for a consumer of %s: %s", loc, offset, size, topic, e)
            return self._answer("unavailable", 503, f"broker {core.broker_id} could not read {loc}: {e}")
        finally:
            self._in_flight -= 1
        core.metrics.part_reads.labels("ok").inc()
        core.metrics.part_read_bytes.inc(len(data))
        return web.Response(body=data, content_type="application/octet-stream")

    @staticmethod
    def _parse(request: web.Request) -> tuple[str, ObjectLocation, int, int]:
        q = request.query
        try:
            topic, bucket, key = q["topic"], q.get("bucket", ""), q["key"]
            offset, size = int(q["offset"]), int(q["size"])
        except (KeyError, ValueError) as e:
            raise InvalidInputError(f"{READ_PATH} needs topic, key, offset and size (integers): {e}") from None
        if offset < 0 or not 0 < size <= MAX_READ_BYTES:
            raise InvalidInputError(f"offset {offset} and size {size}: size must be within 1..{MAX_READ_BYTES}")
        return topic, ObjectLocation(bucket, key), offset, size

    def _not_its(self, topic: str, loc: ObjectLocation) -> str | None:
        """Why `loc` is not an object of `topic` this broker serves (None: it is)."""
        c = self._core.config
        t = self._core.metadata().topics.get(topic)
        if t is None:
            return f"topic {topic} is unknown to broker {self._core.broker_id}"
        bucket = "" if c.storage.kind == "file" else c.s3.bucket
        try:
            k = parse_key(loc.key)
        except InvalidInputError as e:
            return str(e)
        homes = {f"topics/{topic}"} | ({f"groups/{t.storage_group}"} if t.storage_group else set())
        if loc.bucket != bucket or k.cluster != c.cluster.name or k.home not in homes:
            return f"{loc} is not an object of topic {topic} in cluster {c.cluster.name}"
        return None
