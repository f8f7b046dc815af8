"""The codec memq frames its own records in for Kafka readers: each of Kafka's codecs, measured.

A record written by memq's Producer reaches a Kafka reader as a RecordBatch the broker frames
once per part (`memq.kafka_api.records.frame_part`, in the topic's `kafka_compression`). This
bench measures, for every codec (none, gzip, snappy, lz4, zstd):

- in process, one part of `PART_RECORDS` records of 100 B of three kinds (`hex`: the other
  benches' values, hex of random bytes; `json`: log lines; `random`: incompressible): the
  framed bytes (what goes on the wire and into the read cache) and the broker CPU to frame it
  (`process_time`, best of `--rounds`);
- through a real broker (one governed broker process on the dev cluster, a topic per codec,
  the same values written by memq's Producer): the read rate of a confluent-kafka Consumer
  (librdkafka) and of kafka-python (pure Python; null for snappy and lz4 unless their optional
  libraries are installed: not here), best of `--runs`, each from the read cache after an
  untimed read that framed the parts (framing CPU is the in-process figure).

Ratios compare the broker default (`BrokerConfig.kafka_compression`, the codec every tested
client decodes without a plug-in) with the alternatives, higher is better: `wire_vs_none`
(bytes framed uncompressed over bytes in the default, hex values), `frame_cpu_vs_zstd` (zstd's
framing CPU over the default's), `read_vs_zstd` and `read_vs_none` (librdkafka msg/s with the
default over the other's), `kafka_python_read_vs_zstd`.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import kafka.codec
from kafka import KafkaConsumer
from kafka import TopicPartition as KpPartition

from bench.kafka_consume import consume_s, memq_produce
from bench.kafka_produce import PARTITIONS, VALUE_BYTES, _kafka_address, _values
from memq.config import BrokerConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster
from memq.format import Codec, Compressors, LogMessage, encode_batch, encode_message, verify_message
from memq.format.kafka_records import KafkaCodec
from memq.kafka_api.records import frame_part

MiB = 1024 ** 2
CODECS = tuple(c.name.lower() for c in KafkaCodec)
PART_RECORDS = 20_000
PER_MESSAGE = 1_000
READ_TIMEOUT_S = 300
DEFAULT = BrokerConfig().kafka_compression
KP_DECODES = {"none": lambda: True, "gzip": kafka.codec.has_gzip, "snappy": kafka.codec.has_snappy,
              "lz4": kafka.codec.has_lz4, "zstd": kafka.codec.has_zstd}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=None, help="values written and read per codec")
    parser.add_argument("--runs", type=int, default=None, help="reads per codec and client (best counts)")
    parser.add_argument("--rounds", type=int, default=None, help="framings per codec and value kind (best counts)")


def kinds(n: int) -> dict[str, list[bytes]]:
    """`n` values of VALUE_BYTES of each kind."""
    rnd = random.Random(7)
    levels, paths = ("INFO", "WARN", "DEBUG"), ("/api/items", "/api/users", "/healthz")
    json_lines = [json.dumps({"ts": 1_700_000_000 + i, "level": rnd.choice(levels), "path": rnd.choice(paths),
                              "ms": rnd.randint(1, 900)}).encode().ljust(VALUE_BYTES)[:VALUE_BYTES]
                  for i in range(n)]
    return {"hex": _values(n), "json": json_lines, "random": [rnd.randbytes(VALUE_BYTES) for _ in range(n)]}


def part_of(values: list[bytes]) -> bytes:
    """A stored part of zstd Messages of PER_MESSAGE records (keys, a header, timestamps)."""
    zc = Compressors()
    records = [LogMessage(v, b"key-%d" % (i % 100), (("source", b"bench"),), 1_700_000_000_000 + i)
               for i, v in enumerate(values)]
    messages = [encode_message(records[i:i + PER_MESSAGE], producer_id=1, epoch=0, sequence=i, codec=Codec.ZSTD,
                               compressors=zc) for i in range(0, len(records), PER_MESSAGE)]
    headers = [verify_message(m) for m in messages]
    return b"".join(bytes(c) for c in encode_batch(messages, headers, broker_id="bench", created_ms=1))


def framing(rounds: int) -> dict[str, dict[str, dict[str, float]]]:
    """{kind: {codec: {bytes, cpu_ms}}} for one part of each kind."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind, values in kinds(PART_RECORDS).items():
        part = part_of(values)
        out[kind] = {}
        for name in CODECS:
            codec = KafkaCodec[name.upper()]
            best = float("inf")
            for _ in range(rounds):
                t0 = time.process_time()
                framed = frame_part(part, codec=codec)
                best = min(best, time.process_time() - t0)
            out[kind][name] = {"bytes": framed.nbytes, "cpu_ms": round(best * 1000, 2)}
        print(f"framing {PART_RECORDS:,} x {VALUE_BYTES} B {kind}: "
              + ", ".join(f"{c} {v['bytes']:,} B {v['cpu_ms']} ms" for c, v in out[kind].items()), flush=True)
    return out


def kafka_python_s(address: str, topic: str, n: int) -> float:
    """Seconds for a kafka-python consumer, assigned from the beginning, to read `n` values."""
    c = KafkaConsumer(bootstrap_servers=address, enable_auto_commit=False, fetch_max_wait_ms=100,
                      max_partition_fetch_bytes=4 * MiB)
    try:
        t0 = time.perf_counter()
        parts = [KpPartition(topic, p) for p in range(PARTITIONS)]
        c.assign(parts)
        c.seek_to_beginning()
        got = 0
        while got < n:
            if time.perf_counter() - t0 > READ_TIMEOUT_S:
                raise RuntimeError(f"kafka-python read {got} of {n} within {READ_TIMEOUT_S} s")
            got += sum(len(msgs) for msgs in c.poll(timeout_ms=500, max_records=100_000).values())
        return time.perf_counter() - t0
    finally:
        c.close()


def reading(n: int, runs: int) -> dict[str, dict[str, float]]:
    """{codec: {librdkafka_msg_s, kafka_python_msg_s}} through one broker, values written by memq's Producer."""
    rates: dict[str, dict[str, list[float]]] = {c: {"librdkafka_msg_s": [], "kafka_python_msg_s": []} for c in CODECS}
    with tempfile.TemporaryDirectory(prefix="memq-bench-") as tmp, \
            DevCluster(Path(tmp) / "servers") as dc, \
            GovernedCluster(tmp, brokers=1, servers=dc, cluster="bench", broker=BrokerConfig(kafka_port=0)) as gc:
        for name in CODECS:
            gc.create_topic(TopicConfig(f"bench-framing-{name}", read_partitions=PARTITIONS, batch_ms=100,
                                        kafka_compression=name))   # type: ignore[arg-type]  # one of the Literal's
        url = gc.broker("b1").url
        address = _kafka_address(url)
        values = _values(n)
        for name in CODECS:
            memq_produce(url, f"bench-framing-{name}", values)
            consume_s(address, f"bench-framing-{name}", n)   # untimed: frames the parts (the cache keeps them)
        for _ in range(runs):   # interleaved, so drift on a shared machine hits every codec alike
            for name in CODECS:
                topic = f"bench-framing-{name}"
                rates[name]["librdkafka_msg_s"].append(n / consume_s(address, topic, n))
                if KP_DECODES[name]():   # kafka-python decodes snappy and lz4 only with extra libraries
                    rates[name]["kafka_python_msg_s"].append(n / kafka_python_s(address, topic, n))
            print("read msg/s: " + ", ".join(f"{c} {r['librdkafka_msg_s'][-1]:,.0f} (kafka-python "
                                             f"{r['kafka_python_msg_s'][-1] if r['kafka_python_msg_s'] else 0:,.0f})"
                                             for c, r in rates.items()), flush=True)
    return {c: {k: round(max(v)) if v else None for k, v in r.items()} for c, r in rates.items()}


def run(quick: bool, messages: int | None = None, runs: int | None = None, rounds: int | None = None) -> dict:
    framed = framing(rounds or (3 if quick else 7))
    n = messages or (100_000 if quick else 500_000)
    read = reading(n, runs or (1 if quick else 3))
    hexed = framed["hex"]
    lib = {c: r["librdkafka_msg_s"] for c, r in read.items()}
    return {"ratios": {"wire_vs_none": round(hexed["none"]["bytes"] / hexed[DEFAULT]["bytes"], 3),
                       "frame_cpu_vs_zstd": round(hexed["zstd"]["cpu_ms"] / hexed[DEFAULT]["cpu_ms"], 3),
                       "read_vs_zstd": round(lib[DEFAULT] / lib["zstd"], 3),
                       "read_vs_none": round(lib[DEFAULT] / lib["none"], 3),
                       "kafka_python_read_vs_zstd": round(read[DEFAULT]["kafka_python_msg_s"]
                                                          / read["zstd"]["kafka_python_msg_s"], 3)},
            "default": DEFAULT, "framing": framed, "reading": read, "part_records": PART_RECORDS,
            "messages": n, "value_bytes": VALUE_BYTES}
