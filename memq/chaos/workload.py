"""The chaos workload: producers and a consumer group as processes in their own hosts, and the
independent read of everything the servers hold afterwards.

`python -m memq.chaos.workload produce|consume ...` runs inside a namespace host (started by
memq.chaos.run with `ip netns exec`); each writes one JSON line per event to `--out`, which the
harness turns into checker inputs. Record values are JSON {id, p, k, t}: unique id, producer,
key, send time. The consumer de-duplicates (`consumer.dedup`, the default), so the harness
measures what a default reader gets. It auto-commits (every
`consumer.auto_commit_interval_ms`), as most applications do: after a SIGKILL its next
incarnation gets again what was handed over but not committed (at-least-once). With
`--reader kafka` the reader is a confluent-kafka consumer group on the brokers' Kafka
listeners instead (`consume_kafka`): what any Kafka application reading memq gets.

The transactional workload (`--workload txn`, `produce_txn`): each producer is memq's Producer
with a transactional id, writing transactions of `TXN_RECORDS` records, committing most and
aborting `ABORT_SHARE` of them (seeded by its name). A record is logged once its transaction
ended, with the outcome: `commit` (the commit returned: acked), `abort` (no commit was ever asked,
or a commit that failed was then aborted: never to be seen), or `doubt` (a commit failed and so did
the abort: all or none of it may be seen). After any failure the Producer is made again (a new
epoch fences its late requests). `read_committed` is the read after the run, by a new group.

The compacted workload (`--workload compacted`): the same keyed sends to a compacted topic, which
the brokers compact while the faults go on; the group consumer reads the plain tail (it has no
manifest pointers), and `read_state` reads the topic from earliest after the run, compacted
prefix first, as a new application learning the current state would.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from memq.chaos.checker import ABORT, COMMIT, DOUBT, AckEvent, Delivered, KeyedWrite, Pointer, StoredObject, TxnWrite
from memq.config import MemqConfig, load_config
from memq.errors import ConsumerError, MemqError

if TYPE_CHECKING:
    from memq.client.producer import Producer
    from memq.compaction.manifest import ManifestPointers

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 90.0
KEYS = 64
BURST_PAD = 64 * 1024    # bytes of padding per record while bursting (an overload fault)
READERS = ("memq", "kafka")
WORKLOADS = ("plain", "txn", "compacted")
TXN_RECORDS = 20         # records per transaction
ABORT_SHARE = 0.2        # transactions the workload aborts on purpose
TXN_TIMEOUT_MS = 10_000  # a transaction its producer lost track of is aborted by its coordinator this soon
TXN_RETRY_S = 0.5        # pause before making the Producer again after a failure


def _line(out: IO[str], **event: object) -> None:
    out.write(json.dumps(event) + "\n")
    out.flush()


# --- producing ------------------------------------------------------------------------------


async def produce(config: MemqConfig, topic: str, name: str, rate: float, seconds: float, out: IO[str],
                  burst_file: Path | None = None) -> None:
    """Send `rate` records/s for `seconds` at ack=all, logging each send's outcome; while
    `burst_file` exists, records padded to `BURST_PAD` as fast as the producer takes them
    (its max_in_flight_bytes pushes back), instead."""
    from memq.client.producer import Producer

    pending: dict[asyncio.Future[object], tuple[str, str, float]] = {}

    def done(fut: asyncio.Future[object]) -> None:
        rid, key, sent = pending.pop(fut)
        err = None if fut.cancelled() else fut.exception()
        _line(out, id=rid, p=name, k=key, sent=sent, done=time.time(), ok=not fut.cancelled() and err is None,
              err=None if err is None else f"{type(err).__name__}: {err}")

    producer = Producer(dataclasses.replace(config.producer, ack="all"))
    n = 0

    async def send(pad: str = "") -> None:
        nonlocal n
        sent = time.time()
        rid = f"{name}-{n}"
        key = f"k{n % KEYS}"
        value = json.dumps({"id": rid, "p": name, "k": n % KEYS, "t": sent, "pad": pad}).encode()
        fut = await producer.send(topic, value, key=key.encode())
        pending[fut] = (rid, key, sent)  # type: ignore[index]
        fut.add_done_callback(done)  # type: ignore[arg-type]
        n += 1

    t0 = time.time()
    paced = 0
    try:
        while (now := time.time()) < t0 + seconds:
            if burst_file is not None and burst_file.exists():
                await send("x" * BURST_PAD)
                paced = int(rate * (now - t0))     # no catching up on the paced records afterwards
                await asyncio.sleep(0)
                continue
            while paced < rate * (now - t0):
                await send()
                paced += 1
            await asyncio.sleep(0.01)
        await asyncio.wait_for(producer.close(), CLOSE_TIMEOUT_S)
    except TimeoutError:
        pass
    finally:
        for rid, key, sent in list(pending.values()):   # never resolved: counted as failed
            _line(out, id=rid, p=name, k=key, sent=sent, done=time.time(), ok=False, err="unresolved")


async def produce_txn(config: MemqConfig, topic: str, name: str, rate: float, seconds: float, out: IO[str]) -> None:
    """Transactions of `TXN_RECORDS` records sent at `rate` records/s for `seconds`, `ABORT_SHARE`
    of them aborted on purpose (module doc); each record logged with its transaction's outcome."""
    from memq.client.producer import Producer

    rng = random.Random(name)
    producer: Producer | None = None
    n = t = 0
    t0 = time.time()
    while time.time() < t0 + seconds:
        if producer is None:
            producer = Producer(dataclasses.replace(config.producer, ack="all"), transactional_id=f"chaos-{name}",
                                transaction_timeout_ms=TXN_TIMEOUT_MS)
        sent: list[tuple[str, float]] = []
        outcome, err = await _transaction(producer, topic, name, n, rate, rng.random() >= ABORT_SHARE, sent)
        done = time.time()
        for rid, at in sent:
            _line(out, id=rid, p=name, txn=f"{name}-t{t}", sent=at, done=done, ok=outcome == COMMIT,
                  decision=outcome, err=err)
        n += len(sent)
        t += 1
        if err is not None:   # a new Producer: a new epoch, so nothing of this one lands late
            try:
                await asyncio.wait_for(producer.close(), TXN_RETRY_S * 4)
            except (TimeoutError, MemqError):
                pass
            producer = None
            await asyncio.sleep(TXN_RETRY_S)
    if producer is not None:
        await asyncio.wait_for(producer.close(), CLOSE_TIMEOUT_S)


async def _transaction(producer: Producer, topic: str, name: str, first: int, rate: float, commit: bool,
                       sent: list[tuple[str, float]]) -> tuple[str, str | None]:
    """One transaction: its outcome (COMMIT, ABORT or DOUBT) and the error, if any, that ended it."""
    asked_commit = False
    try:
        await producer.begin()
        for i in range(first, first + TXN_RECORDS):
            at = time.time()
            rid = f"{name}-{i}"
            sent.append((rid, at))
            value = json.dumps({"id": rid, "p": name, "k": i % KEYS, "t": at}).encode()
            await producer.send(topic, value, key=f"k{i % KEYS}".encode())
            await asyncio.sleep(1 / rate)
        asked_commit = commit
        await (producer.commit() if commit else producer.abort())
        return (COMMIT if commit else ABORT), None
    except MemqError as e:
        err = f"{type(e).__name__}: {e}"
    if not asked_commit:   # no EndTxn(commit) was ever sent: nothing of it can be committed
        return ABORT, err
    try:   # the commit failed: an abort the coordinator accepts proves it was not decided
        await producer.abort()
    except MemqError:
        return DOUBT, err
    return ABORT, err


# --- consuming ------------------------------------------------------------------------------


def consume(config: MemqConfig, topic: str, group: str, stop_file: Path, catch_up_s: float, out: IO[str],
            seen: set[str]) -> None:
    """Read in a group until `stop_file` (the acked ids, one a line) appears and every id in it
    was delivered, or `catch_up_s` after it appeared. `seen`: ids delivered before (to the
    consumer this one restarts after a SIGKILL), which the group committed and will not repeat."""
    from memq.client.consumer import Consumer

    cc = dataclasses.replace(config.consumer, group_id=group, dedup=True, enable_auto_commit=True)
    want: set[str] | None = None
    deadline = float("inf")
    with Consumer(dataclasses.replace(config, consumer=cc), topic) as c:
        while time.time() < deadline:
            for rec in c.poll(0.5):
                rid = json.loads(rec.value)["id"]
                seen.add(rid)
                _line(out, id=rid, at=time.time())
            if want is None and stop_file.exists():
                want = set(stop_file.read_text().split())
                deadline = time.time() + catch_up_s
            if want is not None and want <= seen:
                return


KAFKA_SESSION_MS = 6000        # the smallest a Kafka group coordinator accepts by default
KAFKA_COMMIT_MS = 1000


def consume_kafka(bootstrap: str, topic: str, group: str, stop_file: Path, catch_up_s: float, out: IO[str],
                  seen: set[str]) -> None:
    """`consume`, as a confluent-kafka consumer group through memq's Kafka listeners. Offsets
    are stored only once a record is logged, then auto-committed: a SIGKILL between the two
    redelivers the record, it never skips one. No de-duplication: Kafka readers get records
    as stored, so a producer's resend counts as a duplicate."""
    from confluent_kafka import Consumer, KafkaError

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": True, "enable.auto.offset.store": False,
                  "auto.commit.interval.ms": KAFKA_COMMIT_MS, "session.timeout.ms": KAFKA_SESSION_MS,
                  "heartbeat.interval.ms": KAFKA_SESSION_MS // 6, "enable.partition.eof": False})
    want: set[str] | None = None
    deadline = float("inf")
    c.subscribe([topic])
    try:
        while time.time() < deadline:
            for m in c.consume(500, 0.5):
                err = m.error()
                if err is not None:
                    if err.fatal():
                        raise ConsumerError(f"Kafka consumer of {topic!r}: {err.str()}")
                    if err.code() != KafkaError._PARTITION_EOF:
                        log.warning("Kafka consumer of %r: %s", topic, err.str())
                    continue
                rid = json.loads(m.value() or b"{}")["id"]
                seen.add(rid)
                _line(out, id=rid, at=time.time())
                c.store_offsets(m)
            if want is None and stop_file.exists():
                want = set(stop_file.read_text().split())
                deadline = time.time() + catch_up_s
            if want is not None and want <= seen:
                return
    finally:
        c.close()


# --- the independent read, from the harness -------------------------------------------------


def read_committed(config: MemqConfig, topic: str, want: set[str], timeout_s: float, quiet_s: float = 3.0) -> list[str]:
    """The record ids a new memq Consumer group gets reading `topic` from the start (memq's readers
    only ever see committed transactions), with its default de-duplication: until every id of
    `want` came and `quiet_s` passed without a record, or `timeout_s`."""
    from memq.client.consumer import Consumer

    cc = dataclasses.replace(config.consumer, group_id=f"chaos-read-{os.getpid()}-{time.time_ns()}",
                             auto_offset_reset="earliest", enable_auto_commit=False)
    got: list[str] = []
    deadline = time.time() + timeout_s
    last = time.time()
    with Consumer(dataclasses.replace(config, consumer=cc), topic) as c:
        while time.time() < deadline and not (want <= set(got) and time.time() - last > quiet_s):
            recs = c.poll(0.5)
            if recs:
                last = time.time()
            got += [json.loads(r.value)["id"] for r in recs]
    return got


def read_state(config: MemqConfig, topic: str, pointers: ManifestPointers, keys: set[str], timeout_s: float,
               quiet_s: float = 3.0) -> dict[str, str]:
    """Key -> id of the last record of that key a new memq Consumer group gets reading the
    compacted `topic` from earliest through the manifests `pointers` names: until every key of
    `keys` came and `quiet_s` passed without a record, or `timeout_s`."""
    from memq.client.consumer import Consumer

    cc = dataclasses.replace(config.consumer, group_id=f"chaos-state-{os.getpid()}-{time.time_ns()}",
                             auto_offset_reset="earliest", enable_auto_commit=False)
    state: dict[str, str] = {}
    deadline = time.time() + timeout_s
    last = time.time()
    with Consumer(dataclasses.replace(config, consumer=cc), topic, pointers=pointers) as c:
        while time.time() < deadline and not (keys <= state.keys() and time.time() - last > quiet_s):
            recs = c.poll(0.5)
            if recs:
                last = time.time()
            for r in recs:
                if r.key is not None and r.value:   # a tombstone reads as an empty value
                    state[bytes(r.key).decode()] = json.loads(r.value)["id"]
    return state


def read_pointers(config: MemqConfig, topic: str, partitions: int) -> list[Pointer]:
    """Every notification of `topic`, from the start of each partition to its end."""
    from memq.client.consumer import notification_topic
    from memq.notify.consumer import NotificationConsumer

    nc = NotificationConsumer(config.kafka, notification_topic(config, topic), group_id=f"chaos-audit-{os.getpid()}")
    out: list[Pointer] = []
    try:
        nc.assign({p: 0 for p in range(partitions)})
        empty = 0
        while empty < 3:
            recs = nc.poll(1.0)
            empty = 0 if recs else empty + 1
            out += [Pointer(r.partition, r.offset, r.notification.key) for r in recs]
    finally:
        nc.close()
    return out


def read_objects(config: MemqConfig) -> list[StoredObject]:
    """Every object in the bucket with the record ids it holds (undecodable: no ids). An object
    gone between the listing and its GET was being collected by the janitor (an orphan: the
    checker finds a referenced object that is missing through its notification instead).
    Compacted parts and manifests (a compacted topic's compaction home) are not the checker's:
    no notification names them, and they copy records the plain objects hold."""
    import boto3
    from botocore.config import Config

    from memq.compaction.manifest import COMPACTION_GROUP_PREFIX

    from memq.errors import FormatError
    from memq.format import decode_batch, split_parts

    s3 = boto3.client("s3", endpoint_url=config.s3.endpoint_url, region_name=config.s3.region,
                      aws_access_key_id=config.s3.access_key_id, aws_secret_access_key=config.s3.secret_access_key,
                      config=Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 5}))
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=config.s3.bucket):
        for item in page.get("Contents", []):
            if f"/groups/{COMPACTION_GROUP_PREFIX}" in item["Key"]:
                continue
            try:
                body = s3.get_object(Bucket=config.s3.bucket, Key=item["Key"])["Body"].read()
            except s3.exceptions.NoSuchKey:
                continue
            try:
                ids = tuple(json.loads(r[0])["id"] for part in split_parts(body)
                            for _, records in decode_batch(part)[1] for r in records)
            except (FormatError, ValueError, KeyError):
                ids = ()
            out.append(StoredObject(item["Key"], ids))
    return out


def _first_outcomes(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The producers' log lines, one per record: a record logged twice (resolved, then
    'unresolved') keeps the first."""
    first: dict[str, dict[str, Any]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            e = json.loads(line)
            first.setdefault(e["id"], e)
    return list(first.values())


def load_acks(paths: Sequence[Path]) -> list[AckEvent]:
    """The producers' logs as the checker's acks."""
    return [AckEvent(e["p"], e["id"], e["sent"], e["done"], e["ok"]) for e in _first_outcomes(paths)]


def load_keyed_writes(paths: Sequence[Path]) -> list[KeyedWrite]:
    """The producers' logs as keyed writes (the compacted workload's checker input)."""
    return [KeyedWrite(e["k"], e["id"], e["sent"], e["done"], e["ok"]) for e in _first_outcomes(paths)]


def load_txn_writes(paths: Sequence[Path]) -> list[TxnWrite]:
    """The transactional producers' logs (`produce_txn`): each record with its transaction's outcome."""
    return [TxnWrite(e["id"], e["txn"], e["decision"]) for path in paths for line in path.read_text().splitlines()
            if (e := json.loads(line))]


def load_delivered(path: Path) -> list[Delivered]:
    """The consumer's log (every incarnation of it appends to one file); none yet: [].

    A line torn by a SIGKILL is skipped: that record was not committed, so it comes again."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        out.append(Delivered(e["id"], e["at"]))
    return out


def _open_log(path: Path) -> IO[str]:
    """`path` for appending; a line torn by a SIGKILL of its previous writer is ended first."""
    out = open(path, "a")
    if out.tell():
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                out.write("\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memq.chaos.workload")
    parser.add_argument("role", choices=["produce", "consume"])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--name", default="p0", help="producer name (record id prefix)")
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--group", default="chaos")
    parser.add_argument("--stop-file", type=Path)
    parser.add_argument("--catch-up-s", type=float, default=60.0)
    parser.add_argument("--burst-file", type=Path, help="producers: send flat out while this file exists")
    parser.add_argument("--reader", choices=READERS, default="memq", help="consume: memq's Consumer, or a Kafka "
                        "consumer group through the brokers' Kafka listeners (--bootstrap)")
    parser.add_argument("--bootstrap", default="", help="consume --reader kafka: the brokers' Kafka listeners")
    parser.add_argument("--workload", choices=WORKLOADS, default="plain",
                        help="produce: plain sends (to a compacted topic too), or transactions committed or aborted "
                        "(produce_txn)")
    args = parser.parse_args(argv)
    config = load_config(args.config, env={})
    with _open_log(args.out) as out:
        if args.role == "produce" and args.workload == "txn":
            asyncio.run(produce_txn(config, args.topic, args.name, args.rate, args.seconds, out))
        elif args.role == "produce":
            asyncio.run(produce(config, args.topic, args.name, args.rate, args.seconds, out, args.burst_file))
        else:
            seen = {d.record_id for d in load_delivered(args.out)}
            stop = args.stop_file or args.out.with_suffix(".stop")
            if args.reader == "kafka":
                consume_kafka(args.bootstrap, args.topic, args.group, stop, args.catch_up_s, out, seen)
            else:
                consume(config, args.topic, args.group, stop, args.catch_up_s, out, seen)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
