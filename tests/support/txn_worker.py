"""A consume-transform-produce worker for tests/test_kafka_txn.py (run as a process, so a test can
SIGKILL it mid-transaction): reads `input` read_committed from its group's committed offsets,
writes "out-<value>" to `output` and commits the input offsets in the same transaction
(confluent-kafka's `send_offsets_to_transaction`), BATCH records a transaction. With
`--die-after K` it commits K transactions, then writes the next one, prints "mid" and waits to
be killed. Without, it stops once every partition is at its end with nothing in flight.

Usage: python txn_worker.py BOOTSTRAP INPUT OUTPUT GROUP TXN_ID PARTITIONS [--die-after K]
"""

from __future__ import annotations

import argparse
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

BATCH = 7
TIMEOUT_S = 30.0


def main() -> None:
    p = argparse.ArgumentParser()
    for name in ("bootstrap", "input", "output", "group", "txn_id"):
        p.add_argument(name)
    p.add_argument("partitions", type=int)
    p.add_argument("--die-after", type=int, default=-1)
    a = p.parse_args()
    producer = Producer({"bootstrap.servers": a.bootstrap, "transactional.id": a.txn_id,
                         "transaction.timeout.ms": 20_000})
    producer.init_transactions(TIMEOUT_S)   # fences a previous worker and aborts its open transaction
    consumer = Consumer({"bootstrap.servers": a.bootstrap, "group.id": a.group, "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "fetch.wait.max.ms": 100})
    parts = [TopicPartition(a.input, i) for i in range(a.partitions)]
    committed = consumer.committed(parts, TIMEOUT_S)
    consumer.assign([TopicPartition(a.input, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
                     for tp in committed])
    at_end: set[int] = set()
    done = 0
    while True:
        batch = []
        deadline = time.monotonic() + 1.0
        while len(batch) < BATCH and time.monotonic() < deadline:
            m = consumer.poll(0.2)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(m.partition())
                    continue
                raise RuntimeError(m.error())
            at_end.discard(m.partition())
            batch.append(m)
        if not batch:
            if len(at_end) == a.partitions:
                break
            continue
        producer.begin_transaction()
        for m in batch:
            producer.produce(a.output, b"out-" + m.value())
        positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
        producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), TIMEOUT_S)
        if done == a.die_after:
            producer.flush(TIMEOUT_S)
            print("mid", flush=True)
            time.sleep(600)
        producer.commit_transaction(TIMEOUT_S)
        done += 1
    consumer.close()
    print(f"done {done}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
