"""`GET /v1/offsets`: where a partition's record offsets stand, for readers outside a broker
(memq's Consumer, the Spark driver) on topics with dense offsets.

`?topic=T&partition=P&note=N` answers `{"note": N, "base": B}`: notification N's records start at
offset B. `?topic=T&partition=P&offset=O` answers the same for the notification holding record O
(O - B is its index there; past the end, the next notification). That is a checkpoint
(`memq.kafka_api.dense.Checkpoint`) a reader counts forward from with the notifications it reads itself,
so it asks once per partition it starts or moves on, never per notification. The broker answers
through its partition's counted bases (`memq.broker.bases`), the ones its Kafka door serves: one
count, one arithmetic for every reader. Reading needs the `consume` ACL on T, as `/v1/read` does.
"""

from __future__ import annotations

from aiohttp import web

from memq.errors import InvalidInputError, MemqError, OffsetUnknownError
from memq.security.acl import Operation

from ..guard import PRINCIPAL_KEY
from ..seam import BrokerCore

OFFSETS_PATH = "/v1/offsets"


class OffsetsDoor:
    def __init__(self, core: BrokerCore, app: web.Application) -> None:
        self._core = core
        app.add_routes([web.get(OFFSETS_PATH, self._offsets)])

    async def _offsets(self, request: web.Request) -> web.Response:
        core = self._core
        q = request.query
        try:
            topic, partition = q["topic"], int(q["partition"])
            by_note = "note" in q
            asked = int(q["note"] if by_note else q["offset"])
            if partition < 0 or asked < 0:
                raise ValueError("negative")
        except (KeyError, ValueError) as e:
            return _error(400, f"{OFFSETS_PATH} needs topic, partition, and note or offset (integers >= 0): {e}")
        principal = request.get(PRINCIPAL_KEY)
        if not core.guard.may(principal, Operation.CONSUME, topic):
            core.guard.count_denial(Operation.CONSUME)
            return _error(403, f"principal {principal} may not consume topic {topic}")
        meta = core.metadata().topics.get(topic)
        if meta is None or not 0 <= partition < meta.read_partitions:
            return _error(404, f"topic {topic} partition {partition} is unknown to broker {core.broker_id}")
        try:
            scheme = await core.logs.bases.scheme(meta, partition)
            if by_note:
                note = asked
                try:
                    base = scheme.start_of(note)
                except OffsetUnknownError:   # past the end this broker's tail saw: count to Kafka's
                    high = (await core.reads.watermarks(meta.notification_topic, partition))[1]
                    base = (await core.logs.bases.scheme(meta, partition, min(note, high))).start_of(note)
            else:
                note, index = scheme.position_of(asked)
                base = asked - index
        except (OffsetUnknownError, InvalidInputError) as e:
            return _error(409, str(e))
        except MemqError as e:
            return _error(503, f"broker {core.broker_id}: {e}")
        return web.json_response({"note": note, "base": base})


def _error(status: int, why: str) -> web.Response:
    return web.json_response({"error": why}, status=status)
