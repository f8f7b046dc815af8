"""A consumer-group member as its own process (`python -m tests.support.group_member`), so a test
can SIGKILL it: it reads, writes what it read to a log file, commits after each batch and writes
"C" once the commit is acknowledged; SIGTERM closes it (it leaves the group).

Log lines: "A <partitions>" on each assignment change, "R <partition> <offset>" per record,
"C" after a commit. `member_log` reads such a log back.
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition


@dataclass
class MemberLog:
    """What one member read: each record, and those read after its last acknowledged commit."""

    read: list[tuple[int, int]] = field(default_factory=list)
    uncommitted: list[tuple[int, int]] = field(default_factory=list)
    assignments: list[tuple[float, frozenset[int]]] = field(default_factory=list)


def member_log(path: Path) -> MemberLog:
    out = MemberLog()
    for line in (path.read_text() if path.exists() else "").splitlines():
        kind, *rest = line.split()
        if kind == "R":
            rec = (int(rest[0]), int(rest[1]))
            out.read.append(rec)
            out.uncommitted.append(rec)
        elif kind == "C":
            out.uncommitted = []
        elif kind == "A":
            out.assignments.append((float(rest[0]), frozenset(int(p) for p in rest[1:])))
    return out


def main(bootstrap: str, topic: str, group: str, protocol: str, log_path: str) -> None:
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": protocol,
            "enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
            "topic.metadata.refresh.interval.ms": 1000}
    if protocol == "classic":
        conf |= {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                 "partition.assignment.strategy": "cooperative-sticky"}
    c = Consumer(conf)
    with open(log_path, "a", buffering=1) as out:
        owned: set[int] = set()

        def changed(parts: list[TopicPartition], given: bool) -> None:
            if given:
                owned.update(tp.partition for tp in parts)
            else:
                owned.difference_update(tp.partition for tp in parts)
            out.write("A %f %s\n" % (time.time(), " ".join(str(p) for p in sorted(owned))))

        c.subscribe([topic], on_assign=lambda _c, parts: changed(parts, True),
                    on_revoke=lambda _c, parts: changed(parts, False), on_lost=lambda _c, parts: changed(parts, False))
        while not stop:
            got = []
            for m in c.consume(200, 0.2):
                if m.error() is None:
                    got.append(m)
                elif m.error().code() not in (KafkaError._PARTITION_EOF, KafkaError._TRANSPORT,
                                              KafkaError._ALL_BROKERS_DOWN):
                    print(f"member: {m.error()}", file=sys.stderr)
            if not got:
                continue
            out.write("".join(f"R {m.partition()} {m.offset()}\n" for m in got))
            try:
                c.commit(asynchronous=False)
                out.write("C\n")
            except KafkaException as e:
                print(f"member: commit failed: {e}", file=sys.stderr)
        c.close()


if __name__ == "__main__":
    main(*sys.argv[1:6])
