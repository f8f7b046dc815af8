"""The schema registry and the produce-time checks: look-up and register latency, and what a
topic's checks cost through the Kafka door.

One dev cluster (moto S3, tansu, ZooKeeper) and two governed brokers with Kafka listeners.
Registry: registrations alternate between the brokers (a new subject and schema each: an id
allocated in ZooKeeper every time); look-ups are `GET /schemas/ids/{id}` (what a deserializer
asks; the broker's cache of ids) and `POST /subjects/{s}` (a serializer's look-up: the subject
read from ZooKeeper), on one keep-alive HTTP connection per broker, as a client holds them.
Checks: a confluent-kafka Producer (acks=all) writes the same framed records (Avro, Protobuf,
JSON Schema; ~100 B and ~1 KiB values) to a topic with `value_schema_validation` and to one
without; cases interleaved, best of `runs`.
Ratios: `register_vs_goal` (the goal, 50 ms, over the register p99), `id_lookup_vs_goal` and
`subject_lookup_vs_goal` (10 ms over each look-up's p99); `checked_vs_plain_<format>` (records/s
checked over plain, 1 KiB values; goal >= 0.8 Avro and Protobuf, >= 0.5 JSON Schema) and
`checked_vs_plain_<format>_100b`; `cpu_per_gib_plain_vs_checked` (the brokers' CPU seconds per GiB
written plain over checked, all formats and sizes); `avro_walk_vs_fastavro` (and `_100b`): in this
process, CPU per record of fastavro reading each payload (the Avro check before its compiled walk)
over the check's (`avro_walk` over the group, fastavro for what it fails). Raw figures: p50/p99
seconds of the registry calls, records/s and broker CPU seconds of each case, the check's ns per record.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

import fastavro
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from bench._cluster import kafka_produce_s
from bench.e2e import quantile
from bench.kafka_produce import _kafka_address
from bench.produce import cpu_s
from memq.config import BrokerConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster

REGISTER_GOAL_S = 0.050
LOOKUP_GOAL_S = 0.010


def _connection(url: str) -> http.client.HTTPConnection:
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=10)


def _call(conn: http.client.HTTPConnection, method: str, path: str, body: object = None) -> tuple[float, object]:
    data = None if body is None else json.dumps(body).encode()
    t0 = time.perf_counter()
    conn.request(method, path, body=data, headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    r = conn.getresponse()
    answer = json.loads(r.read())
    took = time.perf_counter() - t0
    assert r.status == 200, answer
    return took, answer


def _schema(i: int) -> dict:
    return {"schema": json.dumps({"type": "record", "name": f"R{i}", "namespace": "bench", "fields": [
        {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []}]})}


def _order_class() -> Any:
    fdp = descriptor_pb2.FileDescriptorProto(name="bench_order.proto", package="bench", syntax="proto3")
    m = fdp.message_type.add(name="Order")
    F = descriptor_pb2.FieldDescriptorProto
    for i, (name, kind) in enumerate((("id", F.TYPE_INT64), ("name", F.TYPE_STRING), ("payload", F.TYPE_STRING)), 1):
        m.field.add(name=name, number=i, type=kind, label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return fdp, message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Order"))


AVRO_ORDER = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"}, {"name": "payload", "type": "string"}]}
JSON_ORDER = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 64},
                                               "payload": {"type": "string"}},
              "required": ["id", "name", "payload"], "additionalProperties": False}


def _framed(fmt: str, schema_id: int, n: int, size: int) -> list[bytes]:
    """`n` framed values of about `size` bytes in `fmt` (Confluent's framing: 0, id, payload)."""
    head = b"\0" + schema_id.to_bytes(4, "big") + (b"\0" if fmt == "PROTOBUF" else b"")
    pad = "x" * max(size - 40, 1)
    parsed = fastavro.parse_schema(AVRO_ORDER)
    order = _order_class()[1]
    out = []
    for i in range(n):
        v = {"id": i, "name": f"order-{i}", "payload": pad}
        if fmt == "AVRO":
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, parsed, v)
            out.append(head + buf.getvalue())
        elif fmt == "JSON":
            out.append(head + json.dumps(v, separators=(",", ":")).encode())
        else:
            out.append(head + order(**v).SerializeToString())
    return out


def _schema_text(fmt: str) -> str:
    if fmt == "AVRO":
        return json.dumps(AVRO_ORDER)
    if fmt == "JSON":
        return json.dumps(JSON_ORDER)
    return base64.standard_b64encode(_order_class()[0].SerializeToString()).decode()


def _checks(gc: GovernedCluster, conn: http.client.HTTPConnection, n: int, runs: int) -> dict:
    """Records/s and broker CPU per case, plain against checked, through the Kafka door."""
    address = _kafka_address(gc.broker("b1").url)
    pids = [gc.broker(b).pid for b in ("b1", "b2")]
    figures: dict[str, dict] = {}
    cpu = {"plain": 0.0, "checked": 0.0}
    written = {"plain": 0, "checked": 0}
    for fmt in ("AVRO", "PROTOBUF", "JSON"):
        for size in (100, 1024):
            case = f"{fmt.lower()}_{size}b"
            plain, checked = f"plain-{case}", f"checked-{case}"
            gc.create_topic(TopicConfig(plain, read_partitions=3))
            gc.create_topic(TopicConfig(checked, read_partitions=3, value_schema_validation=True))
            _, answer = _call(conn, "POST", f"/subjects/{checked}-value/versions",
                              {"schema": _schema_text(fmt), "schemaType": fmt})
            values = _framed(fmt, answer["id"], n, size)   # type: ignore[index]
            kafka_produce_s(address, plain, values[:2000])      # warm up: connections, metadata, decoders
            kafka_produce_s(address, checked, values[:2000])
            rates: dict[str, list[float]] = {"plain": [], "checked": []}
            for _ in range(runs):
                for kind, topic in (("plain", plain), ("checked", checked)):
                    before = sum(cpu_s(p) for p in pids)
                    rates[kind].append(n / kafka_produce_s(address, topic, values))
                    cpu[kind] += sum(cpu_s(p) for p in pids) - before
                    written[kind] += sum(map(len, values))
            figures[case] = {k: max(v) for k, v in rates.items()}
            print(f"{case}: plain {figures[case]['plain']:,.0f} rec/s, checked {figures[case]['checked']:,.0f} rec/s",
                  flush=True)
    per_gib = {k: cpu[k] / (written[k] / 2**30) for k in cpu}
    ratios = {f"checked_vs_plain_{fmt.lower()}{'' if size == 1024 else '_100b'}":
              figures[f"{fmt.lower()}_{size}b"]["checked"] / figures[f"{fmt.lower()}_{size}b"]["plain"]
              for fmt in ("AVRO", "PROTOBUF", "JSON") for size in (1024, 100)}
    ratios["cpu_per_gib_plain_vs_checked"] = per_gib["plain"] / per_gib["checked"]
    return {"ratios": ratios, "records_per_s": figures, "broker_cpu_s_per_gib": per_gib}


def run(quick: bool) -> dict:
    n = 200 if quick else 1000
    records, runs = (10_000, 1) if quick else (100_000, 3)
    with tempfile.TemporaryDirectory(prefix="memq-bench-") as tmp, DevCluster(Path(tmp) / "servers") as dc, \
            GovernedCluster(tmp, brokers=2, servers=dc, cluster="bench", broker=BrokerConfig(kafka_port=0)) as gc:
        conns = [_connection(gc.broker(b).url) for b in ("b1", "b2")]
        register, ids = [], []
        for i in range(n):
            took, answer = _call(conns[i % 2], "POST", f"/subjects/s{i}/versions", _schema(i))
            register.append(took)
            ids.append(answer["id"])   # type: ignore[index]
        by_id = [_call(conns[i % 2], "GET", f"/schemas/ids/{ids[i]}")[0] for i in range(n)]
        by_id = [_call(conns[i % 2], "GET", f"/schemas/ids/{ids[i]}")[0] for i in range(n)]   # warm: cached
        by_subject = [_call(conns[i % 2], "POST", f"/subjects/s{i}", _schema(i))[0] for i in range(n)]
        checks = _checks(gc, conns[0], records, runs)
        for c in conns:
            c.close()
    figures = {name: {"p50_s": quantile(sorted(xs), 0.5), "p99_s": quantile(sorted(xs), 0.99)}
               for name, xs in (("register", register), ("id_lookup", by_id), ("subject_lookup", by_subject))}
    for name, f in figures.items():
        print(f"{name}: p50 {f['p50_s'] * 1000:.2f} ms, p99 {f['p99_s'] * 1000:.2f} ms", flush=True)
    walk = _avro_check_ns(20_000 if quick else 100_000)
    return {"ratios": {"register_vs_goal": REGISTER_GOAL_S / figures["register"]["p99_s"],
                       "id_lookup_vs_goal": LOOKUP_GOAL_S / figures["id_lookup"]["p99_s"],
                       "subject_lookup_vs_goal": LOOKUP_GOAL_S / figures["subject_lookup"]["p99_s"],
                       **checks.pop("ratios"), **walk.pop("ratios")},
            "registrations": n, **figures, **checks, "avro_check_ns_per_record": walk}


def _avro_check_ns(n: int) -> dict:
    """In this process, CPU ns per record of the brokers' Avro check (`check._avro_decoder`: the
    compiled walk over the group, fastavro for those it fails) against fastavro reading each
    record (the check before the walk), on the same framed values: best of three each."""
    from memq.schema import avro
    from memq.schema.check import _avro_decoder

    decode = _avro_decoder(avro.parse(json.dumps(AVRO_ORDER)))
    parsed = fastavro.parse_schema(AVRO_ORDER)
    out: dict = {"ratios": {}}
    for size in (100, 1024):
        values = _framed("AVRO", 1, n, size)
        at = range(len(values))

        def one_by_one() -> None:
            for v in values:
                buf = io.BytesIO(v)
                buf.seek(5)
                fastavro.schemaless_reader(buf, parsed, None)

        decode(values, at, 5)   # compiled before it is timed
        took = {}
        for name, work in (("walk", lambda: decode(values, at, 5)), ("fastavro", one_by_one)):
            best = float("inf")
            for _ in range(3):
                t0 = time.process_time()
                work()
                best = min(best, time.process_time() - t0)
            took[name] = best / n * 1e9
        tag = "" if size == 1024 else "_100b"
        out[f"walk_ns{tag}"], out[f"fastavro_ns{tag}"] = round(took["walk"]), round(took["fastavro"])
        out["ratios"][f"avro_walk_vs_fastavro{tag}"] = took["fastavro"] / took["walk"]
        print(f"Avro check {size} B: walk {took['walk']:.0f} ns/record, fastavro {took['fastavro']:.0f}", flush=True)
    return out
