"""The schema registry door on real brokers of a governed cluster: confluent-kafka's
SchemaRegistryClient and its Avro and JSON Schema serializers register through one broker,
produce through memq's Kafka listener, and read every record back through the other broker's
registry; Confluent's error bodies, codes and content type; ids stay unique and served after a
broker is SIGKILLed."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from memq.client.cluster import fetch_metadata
from memq.config import BrokerConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster
from tests.support.schemas import order_message_class

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

AVRO = json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "item", "type": "string"},
    {"name": "qty", "type": ["null", "int"], "default": None}]})
JSON_SCHEMA = json.dumps({"type": "object", "properties": {"id": {"type": "integer"}, "item": {"type": "string"}},
                          "required": ["id", "item"]})
RECORDS = 300


class Cluster:
    def __init__(self, gc: GovernedCluster) -> None:
        self.gc = gc
        meta = fetch_metadata(gc.broker("b1").url, 10.0)
        self.kafka = {b.id: b.kafka_address for b in meta.brokers}
        self.url = {b: gc.broker(b).url for b in ("b1", "b2")}


@pytest.fixture(scope="module")
def cluster(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with GovernedCluster(tmp_path_factory.mktemp("schema-cluster"), brokers=2, servers=devcluster,
                         cluster=f"sr{uuid.uuid4().hex[:6]}", broker=BrokerConfig(kafka_port=0)) as gc:
        yield Cluster(gc)


def call(url: str, method: str = "GET", body: Any = None) -> tuple[int, str, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers["Content-Type"], json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], json.loads(e.read())


def read_back(address: str, topic: str, n: int, partitions: int) -> list[tuple[bytes | None, bytes]]:
    c = Consumer({"bootstrap.servers": address, "group.id": f"sr-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        got: list[tuple[bytes | None, bytes]] = []
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error() is None:
                    got.append((m.key(), m.value()))
        return got
    finally:
        c.close()


@pytest.mark.parametrize("fmt", ["avro", "json", "protobuf"])
def test_confluent_serializers_through_memq_with_either_broker_as_registry(cluster: Cluster, fmt: str) -> None:
    topic = f"orders-{fmt}-{uuid.uuid4().hex[:6]}"
    cluster.gc.create_topic(TopicConfig(topic, read_partitions=2, batch_ms=50), brokers=2)
    writer_registry = SchemaRegistryClient({"url": cluster.url["b1"]})
    reader_registry = SchemaRegistryClient({"url": cluster.url["b2"]})
    if fmt == "avro":
        ser = AvroSerializer(writer_registry, AVRO)
        de = AvroDeserializer(reader_registry)
        values = [{"id": i, "item": f"item-{i}", "qty": i if i % 3 else None} for i in range(RECORDS)]
    elif fmt == "json":
        ser = JSONSerializer(JSON_SCHEMA, writer_registry)
        de = JSONDeserializer(None, schema_registry_client=reader_registry)
        values = [{"id": i, "item": f"item-{i}"} for i in range(RECORDS)]
    else:
        order = order_message_class()
        protobuf_ser = ProtobufSerializer(order, writer_registry)
        protobuf_de = ProtobufDeserializer(order, {"use.latest.version": False}, reader_registry)
        ser = lambda v, c: protobuf_ser(order(**v), c)   # noqa: E731
        de = lambda raw, c: (lambda m: {"id": m.id, "item": m.item})(protobuf_de(raw, c))   # noqa: E731
        values = [{"id": i, "item": f"item-{i}"} for i in range(RECORDS)]
    producer = Producer({"bootstrap.servers": cluster.kafka["b1"], "linger.ms": 5})
    ctx = SerializationContext(topic, MessageField.VALUE)
    for v in values:
        producer.produce(topic, key=str(v["id"]).encode(), value=ser(v, ctx))
    assert producer.flush(60) == 0
    got = read_back(cluster.kafka["b2"], topic, RECORDS, 2)
    assert sorted((de(value, ctx) for _, value in got), key=lambda v: v["id"]) == values
    # the subject as the serializer named it (TopicNameStrategy), answered alike by both brokers
    subject = f"{topic}-value"
    latest = [SchemaRegistryClient({"url": u}).get_latest_version(subject) for u in cluster.url.values()]
    assert latest[0].schema_id == latest[1].schema_id and latest[0].version == latest[1].version == 1
    assert reader_registry.get_subjects() == writer_registry.get_subjects()


def test_a_serializer_writing_header_guids_is_read_by_the_default_deserializer(cluster: Cluster) -> None:
    """confluent-kafka's header serializer puts the schema's GUID (from the registration's
    answer) in a header; the default deserializer asks the other broker for it by GUID."""
    from confluent_kafka.schema_registry import header_schema_id_serializer

    topic = f"guids-{uuid.uuid4().hex[:6]}"
    ser = AvroSerializer(SchemaRegistryClient({"url": cluster.url["b1"]}), AVRO,
                         conf={"schema.id.serializer": header_schema_id_serializer})
    de = AvroDeserializer(SchemaRegistryClient({"url": cluster.url["b2"]}))
    value = {"id": 7, "item": "tea", "qty": 2}
    ctx = SerializationContext(topic, MessageField.VALUE, headers=[])
    payload = ser(value, ctx)
    assert payload[:1] != b"\0" and ctx.headers and ctx.headers[0][0] == "__value_schema_id"   # no id framed
    assert de(payload, SerializationContext(topic, MessageField.VALUE, headers=ctx.headers)) == value
    guid = str(uuid.UUID(bytes=bytes(ctx.headers[0][1])[1:]))
    status, _, body = call(cluster.url["b2"] + f"/schemas/guids/{guid}")
    assert status == 200 and body["guid"] == guid and json.loads(body["schema"])["name"] == "Order"


def test_rest_contract_error_codes_and_content_type(cluster: Cluster) -> None:
    b1, b2 = cluster.url["b1"], cluster.url["b2"]
    status, ctype, body = call(f"{b1}/schemas/types")
    assert (status, ctype, body) == (200, "application/vnd.schemaregistry.v1+json", ["JSON", "PROTOBUF", "AVRO"])
    s = f"contract-{uuid.uuid4().hex[:6]}"
    assert call(f"{b1}/subjects/{s}/versions")[::2] == (404, {"error_code": 40401,
                                                               "message": f"Subject '{s}' not found."})
    status, _, body = call(f"{b1}/subjects/{s}/versions", "POST", {"schema": AVRO})
    assert status == 200 and isinstance(body["id"], int)
    incompatible = json.dumps({**json.loads(AVRO), "fields": json.loads(AVRO)["fields"] + [
        {"name": "extra", "type": "string"}]})
    status, _, err = call(f"{b2}/subjects/{s}/versions", "POST", {"schema": incompatible})
    assert status == 409 and err["error_code"] == 409 and "READER_FIELD_MISSING_DEFAULT_VALUE" in err["message"]
    status, _, verdict = call(f"{b2}/compatibility/subjects/{s}/versions/latest?verbose=true", "POST",
                              {"schema": incompatible})
    assert status == 200 and verdict["is_compatible"] is False and verdict["messages"]
    assert call(f"{b2}/subjects/{s}/versions", "POST", {"schema": "{nope"})[2]["error_code"] == 42201
    assert call(f"{b2}/subjects/{s}/versions/0")[2]["error_code"] == 42202
    assert call(f"{b2}/schemas/ids/999999")[::2] == (404, {"error_code": 40403, "message": "Schema 999999 not found"})
    assert call(f"{b2}/config/{s}", "PUT", {"compatibility": "FULL"})[2] == {"compatibility": "FULL"}
    assert call(f"{b1}/config/{s}")[2] == {"compatibilityLevel": "FULL"}
    assert call(f"{b1}/schemas/ids/{body['id']}/schema")[2] == json.loads(AVRO)
    assert call(f"{b1}/subjects/{s}", "POST", {"schema": AVRO})[2]["version"] == 1
    client = SchemaRegistryClient({"url": b2})
    with pytest.raises(SchemaRegistryError) as e:
        client.register_schema(s, Schema(incompatible, "AVRO"))
    assert e.value.http_status_code == 409 and e.value.error_code == 409


def produce_each(address: str, topic: str, values: list[bytes], flush_each: bool) -> list[str | None]:
    """Each value's delivery error (None: stored); `flush_each`: one Produce request per value."""
    outcome: list[str | None] = [None] * len(values)
    producer = Producer({"bootstrap.servers": address, "linger.ms": 5, "retries": 0})
    for i, v in enumerate(values):
        producer.produce(topic, value=v, on_delivery=lambda err, _m, i=i: outcome.__setitem__(
            i, None if err is None else err.name()))
        if flush_each:
            producer.flush(30)
    assert producer.flush(60) == 0
    return outcome


def checked_serializer(fmt: str, registry: SchemaRegistryClient) -> tuple[Any, list[bytes]]:
    """A value serializer of `fmt` (dict -> framed bytes) and payloads of `fmt` that do not decode,
    framed with the id it registers (the framing added on first use)."""
    if fmt == "avro":
        avro = AvroSerializer(registry, AVRO)
        return (lambda v, c: avro({"qty": None, **v}, c)), [b"\x04"]      # a long, then nothing
    if fmt == "json":
        js = JSONSerializer(JSON_SCHEMA, registry)
        return js, [b'{"id": "one", "item": 1}', b"not json"]
    order = order_message_class()
    pb = ProtobufSerializer(order, registry)
    return (lambda v, c: pb(order(**v), c)), [b"\x0a\xff"]               # a string running past the end


@pytest.mark.parametrize(("fmt", "action"), [("avro", "reject"), ("json", "reject"), ("protobuf", "reject"),
                                             ("avro", "warn")])
def test_a_topic_with_value_checks_refuses_or_counts_what_does_not_decode(cluster: Cluster, fmt: str,
                                                                           action: str) -> None:
    """Thousands of valid records and every kind of bad one: under reject none reaches a reader and
    each refusal is INVALID_RECORD; under warn all are stored; no valid record is lost."""
    topic = f"checked-{fmt}-{action}-{uuid.uuid4().hex[:6]}"
    cluster.gc.create_topic(TopicConfig(topic, read_partitions=1, batch_ms=50, value_schema_validation=True,
                                        schema_validation_action=action), brokers=2)
    registry = SchemaRegistryClient({"url": cluster.url["b2"]})
    ser, undecodable = checked_serializer(fmt, registry)
    ctx = SerializationContext(topic, MessageField.VALUE)
    good = [ser({"id": i, "item": f"item-{i}"}, ctx) for i in range(2000)]
    head = good[0][:6] if fmt == "protobuf" else good[0][:5]                 # magic, id (and message index)
    other = registry.register_schema(f"other-{topic}-value", Schema(json.dumps({"type": "string"}), "AVRO"))
    bad = [b"no magic byte", good[0][:3], b"\0\0\x0f\x42\x40" + good[0][5:],  # unknown id 1000000
           b"\0" + other.to_bytes(4, "big") + good[0][5:],                      # another subject's id
           *(head + u for u in undecodable)]
    address = cluster.kafka["b1"]
    assert produce_each(address, topic, good, flush_each=False) == [None] * len(good)
    outcome = produce_each(address, topic, bad, flush_each=True)
    expected = "INVALID_RECORD" if action == "reject" else None
    assert outcome == [expected] * len(bad), outcome
    last = ser({"id": -1, "item": "last"}, ctx)
    assert produce_each(address, topic, [last], flush_each=True) == [None]
    stored = len(good) + (len(bad) if action == "warn" else 0) + 1
    values = [v for _, v in read_back(cluster.kafka["b2"], topic, stored, 1)]
    # one partition, in order: every valid record, then the bad ones only if warned, then the last
    assert values == good + (bad if action == "warn" else []) + [last]


def test_dlq_stores_the_valid_records_and_dead_letters_the_rest(cluster: Cluster) -> None:
    """One request mixing valid and invalid records under dlq: the valid ones are stored in order,
    every invalid one is in <topic>.dlq with its reason, schema id and place; the producer sees
    success for all."""
    topic = f"checked-dlq-{uuid.uuid4().hex[:6]}"
    for name in (topic, f"{topic}.dlq"):
        cluster.gc.create_topic(TopicConfig(name, read_partitions=1, batch_ms=50, value_schema_validation=name == topic,
                                            schema_validation_action="dlq"), brokers=2)
    registry = SchemaRegistryClient({"url": cluster.url["b1"]})
    ser, _ = checked_serializer("avro", registry)
    ctx = SerializationContext(topic, MessageField.VALUE)
    good = [ser({"id": i, "item": f"item-{i}"}, ctx) for i in range(1000)]
    bad = {i: b"not framed %d" % i for i in range(5, 1000, 100)}
    mixed = [bad.get(i, v) for i, v in enumerate(good)]
    assert produce_each(cluster.kafka["b1"], topic, mixed, flush_each=False) == [None] * len(mixed)
    stored = [v for _, v in read_back(cluster.kafka["b2"], topic, len(good) - len(bad), 1)]
    assert stored == [v for i, v in enumerate(good) if i not in bad]
    c = Consumer({"bootstrap.servers": cluster.kafka["b2"], "group.id": f"dlq-{uuid.uuid4().hex[:6]}"})
    try:
        c.assign([TopicPartition(f"{topic}.dlq", 0, OFFSET_BEGINNING)])
        letters = []
        deadline = time.monotonic() + 60
        while len(letters) < len(bad) and time.monotonic() < deadline:
            letters += [m for m in c.consume(100, 0.5) if m.error() is None]
    finally:
        c.close()
    assert [m.value() for m in letters] == list(bad.values())
    headers = dict(letters[0].headers() or [])
    assert headers["memq.dlq.reason"].startswith(b"no magic byte") and headers["memq.dlq.topic"] == topic.encode()


def test_ids_stay_unique_and_served_after_a_broker_is_killed(cluster: Cluster) -> None:
    """Registrations go to both brokers from several threads while one is SIGKILLed: every id a
    client was given is unique and served by the survivor, and what it registers next gets new
    ids. (Last in this module: it leaves one broker.)"""
    tag = uuid.uuid4().hex[:6]
    clients = {b: SchemaRegistryClient({"url": u, "max.retries": 0}) for b, u in cluster.url.items()}

    def register(i: int) -> tuple[str, int] | None:
        text = json.dumps({"type": "record", "name": f"K{tag}{i}", "fields": [{"name": "a", "type": "int"}]})
        if i == 20:
            cluster.gc.kill_broker("b1")   # mid-way, while the other threads register
        try:
            return text, clients["b1" if i % 2 else "b2"].register_schema(f"kill-{tag}-{i}", Schema(text, "AVRO"))
        except Exception:   # b1 gone: the call fails (it may or may not have been stored)
            return None

    with ThreadPoolExecutor(4) as pool:
        given = [g for g in pool.map(register, range(60)) if g is not None]
    assert len(given) >= 30 and len({i for _, i in given}) == len(given)
    survivor = SchemaRegistryClient({"url": cluster.url["b2"]})
    for text, schema_id in given:
        assert json.loads(survivor.get_schema(schema_id).schema_str) == json.loads(text)
    more = [survivor.register_schema(f"kill-{tag}-after-{i}", Schema(json.dumps(
        {"type": "record", "name": f"A{tag}{i}", "fields": [{"name": "a", "type": "int"}]}), "AVRO"))
        for i in range(5)]
    assert len({i for _, i in given} | set(more)) == len(given) + 5 and min(more) > max(i for _, i in given)
