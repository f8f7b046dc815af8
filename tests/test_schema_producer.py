"""memq's own Producer on a topic with schema checks (its WebSocket door): a Message holding a
record that fails is refused with InvalidRecordError naming the record, nothing of it stored; a
valid one is stored; `warn` stores both. memq's Serde frames values with registered schemas as
Confluent's serializers do, and decodes them back. One in-process broker (registry in memory)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
import json

import aiohttp
import fastavro
import pytest

from memq.client.consumer import Consumer
from memq.client.producer import Producer
from memq.client.serde import Serde
from memq.config import AuditConfig
from memq.devcluster import DevCluster
from memq.errors import InvalidRecordError
from tests.support.cluster import drain, producer_config, read_stored, running_broker, topic_config
from tests.support.schemas import order_message_class

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


async def test_serde_frames_with_registered_schemas_and_decodes_them(devcluster: DevCluster, unique_name) -> None:  # type: ignore[no-untyped-def]
    topic = unique_name("serde")
    config = dataclasses.replace(devcluster.config(topics=[
        topic_config(topic, read_partitions=1, value_schema_validation=True)]), audit=AuditConfig(enabled=False))
    order = order_message_class()
    proto = base64.standard_b64encode(order.DESCRIPTOR.file.serialized_pb).decode()
    async with running_broker(config) as broker:
        pc = producer_config(broker.url, linger_ms=1)
        serde = Serde(pc)
        avro = await asyncio.to_thread(serde.serializer, f"{topic}-value", json.dumps(AVRO))
        as_json = await asyncio.to_thread(serde.serializer, "json-value", json.dumps({"type": "object"}), "JSON")
        as_proto = await asyncio.to_thread(serde.serializer, "proto-value", proto, "PROTOBUF")
        async with Producer(pc) as p:
            assert (await (await p.send(topic, avro({"id": 7})))).key   # the topic's checks take it
        (value,) = [v for _, v, _ in (await read_stored(config, topic))[0].values()]
        assert await asyncio.to_thread(serde.decode, value) == {"id": 7}
        assert await asyncio.to_thread(serde.decode, as_json({"a": [1]})) == {"a": [1]}
        assert await asyncio.to_thread(serde.decode, as_proto(order(id=3, item="tea"))) == {"id": "3", "item": "tea"}


async def test_dlq_takes_the_failing_records_of_a_memq_message(devcluster: DevCluster, unique_name) -> None:  # type: ignore[no-untyped-def]
    topic = unique_name("dlq")
    config = dataclasses.replace(devcluster.config(topics=[
        topic_config(topic, read_partitions=1, value_schema_validation=True, schema_validation_action="dlq"),
        topic_config(f"{topic}.dlq", read_partitions=1)]), audit=AuditConfig(enabled=False))
    async with running_broker(config) as broker, aiohttp.ClientSession() as http:
        async with http.post(f"{broker.url}/subjects/{topic}-value/versions", json={"schema": json.dumps(AVRO)}) as r:
            sid = (await r.json())["id"]
        values = [framed(sid, {"id": i}) if i % 3 else b"bad %d" % i for i in range(30)]
        async with Producer(producer_config(broker.url, linger_ms=50)) as p:
            assert await (await p.send_many(topic, values))   # one Message, good and bad together: acked
    stored = (await read_stored(config, topic))[0]
    assert sorted(v for _, v, _ in stored.values()) == sorted(v for i, v in enumerate(values) if i % 3)
    letters = (await read_stored(config, f"{topic}.dlq"))[0]
    assert sorted(v for _, v, _ in letters.values()) == sorted(v for i, v in enumerate(values) if not i % 3)
    headers = dict(next(iter(letters.values()))[2])
    assert headers["memq.dlq.reason"].startswith(b"no magic byte") and headers["memq.dlq.topic"] == topic.encode()


async def test_consumer_returns_values_decoded_with_the_schema_their_id_names(devcluster: DevCluster,  # type: ignore[no-untyped-def]
                                                                             unique_name) -> None:
    """memq's Consumer given `Serde.decode` as its value deserializer hands over decoded values:
    two schema versions of one subject (each record decoded with its own id's), through a broker
    whose topic checks them, read back from S3 by the Consumer."""
    topic = unique_name("typed")
    config = dataclasses.replace(devcluster.config(topics=[
        topic_config(topic, read_partitions=1, value_schema_validation=True)]), audit=AuditConfig(enabled=False))
    v2 = {**AVRO, "fields": [*AVRO["fields"], {"name": "note", "type": "string", "default": ""}]}   # type: ignore[list-item]
    async with running_broker(config) as broker:
        pc = producer_config(broker.url, linger_ms=1)
        serde = Serde(pc)
        first = await asyncio.to_thread(serde.serializer, f"{topic}-value", json.dumps(AVRO))
        second = await asyncio.to_thread(serde.serializer, f"{topic}-value", json.dumps(v2))
        async with Producer(pc) as p:
            for i in range(3):
                await (await p.send(topic, first({"id": i}), key=b"k%d" % i))
            await (await p.send(topic, second({"id": 9, "note": "v2"})))
        config = dataclasses.replace(config, producer=pc)
        consumer = Consumer(config, topic, group_id=unique_name("g"), value_deserializer=Serde(pc).decode,
                            key_deserializer=bytes.decode)
        try:
            got = await asyncio.to_thread(drain, consumer, 4)
        finally:
            consumer.close()
    assert [r.value for r in got] == [{"id": 0}, {"id": 1}, {"id": 2}, {"id": 9, "note": "v2"}]
    assert [r.key for r in got] == ["k0", "k1", "k2", None]
