"""memq's own Producer on a topic with schema checks (its WebSocket door): a Message holding a
record that fails is refused with InvalidRecordError naming the record, nothing of it stored; a
valid one is stored; `warn` stores both. One in-process broker (registry in memory)."""

from __future__ import annotations

import dataclasses
import io
import json

import aiohttp
import fastavro
import pytest

from memq.client.producer import Producer
from memq.config import AuditConfig
from memq.devcluster import DevCluster
from memq.errors import InvalidRecordError
from tests.support.cluster import producer_config, read_stored, running_broker, topic_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

AVRO = {"type": "record", "name": "Order", "namespace": "shop", "fields": [{"name": "id", "type": "long"}]}


def framed(schema_id: int, value: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(AVRO), value)
    return b"\0" + schema_id.to_bytes(4, "big") + buf.getvalue()


async def test_memq_producer_is_refused_a_record_that_fails(devcluster: DevCluster, unique_name) -> None:  # type: ignore[no-untyped-def]
    rejected, warned = unique_name("checked"), unique_name("warned")
    config = dataclasses.replace(devcluster.config(topics=[
        topic_config(rejected, read_partitions=1, value_schema_validation=True),
        topic_config(warned, read_partitions=1, value_schema_validation=True, schema_validation_action="warn")]),
        audit=AuditConfig(enabled=False))
    async with running_broker(config) as broker, aiohttp.ClientSession() as http:
        ids = {}
        for topic in (rejected, warned):
            async with http.post(f"{broker.url}/subjects/{topic}-value/versions", json={"schema": json.dumps(AVRO)}) as r:
                ids[topic] = (await r.json())["id"]
        async with Producer(producer_config(broker.url, linger_ms=1)) as p:
            for topic in (rejected, warned):
                assert (await (await p.send(topic, framed(ids[topic], {"id": 1})))).key
            with pytest.raises(InvalidRecordError, match=r"record 0: value: no magic byte"):
                await (await p.send(rejected, b"not framed"))
            assert (await (await p.send(warned, b"not framed"))).key
    stored_rejected = [v for _, v, _ in (await read_stored(config, rejected))[0].values()]
    stored_warned = sorted(v for _, v, _ in (await read_stored(config, warned))[0].values())
    assert stored_rejected == [framed(ids[rejected], {"id": 1})]
    assert stored_warned == sorted([framed(ids[warned], {"id": 1}), b"not framed"])
