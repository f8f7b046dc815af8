"""A consumer-group member as its own process (`python -m bench._group_member BOOTSTRAP TOPIC
GROUP PROTOCOL LOG [INSTANCE_ID [SESSION_MS]]`), so a benchmark or a test can SIGKILL it: it reads, logs what it read,
commits after each batch and logs "C" once the commit is acknowledged; SIGTERM closes it (it
leaves the group). `group.protocol` is PROTOCOL (`consumer`: KIP-848, `classic`).

Log lines: "S <time>" once subscribed, "A <time> <partitions...>" on each assignment change,
"B <time>" before each batch's "R <partition> <offset>" lines, "C" after a commit.
`member_log` reads such a log back.
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

#: Errors a member rides out (a broker killed, a coordinator moving): the client retries them.
_PASSING = (KafkaError._PARTITION_EOF, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)


@dataclass
class MemberLog:
    """What one member read: each record with the time of its batch, the records read after its
    last acknowledged commit, and when it subscribed."""

    read: list[tuple[int, int]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)   # per record in `read`
    uncommitted: list[tuple[int, int]] = field(default_factory=list)
    started: float | None = None
    assignments: list[tuple[float, frozenset[int]]] = field(default_factory=list)   # (time, partitions owned)

    def acquired(self, partition: int) -> float | None:
        """When it last came to own `partition` (None: it does not own it now)."""
        since = None
        before: frozenset[int] = frozenset()
        for t, owned in self.assignments:
            if partition in owned and partition not in before:
                since = t
            before = owned
        return since if partition in before else None


def member_log(path: Path) -> MemberLog:
    out = MemberLog()
    now = 0.0
    for line in (path.read_text() if path.exists() else "").splitlines():
        kind, *rest = line.split()
        if kind == "R":
            rec = (int(rest[0]), int(rest[1]))
            out.read.append(rec)
            out.times.append(now)
            out.uncommitted.append(rec)
        elif kind == "B":
            now = float(rest[0])
        elif kind == "C":
            out.uncommitted = []
        elif kind == "S":
            out.started = float(rest[0])
        elif kind == "A":
            out.assignments.append((float(rest[0]), frozenset(int(p) for p in rest[1:])))
    return out


def main(bootstrap: str, topic: str, group: str, protocol: str, log_path: str, instance_id: str = "",
         session_ms: str = "") -> None:
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": protocol,
            "enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
            "topic.metadata.refresh.interval.ms": 1000}
    if protocol == "classic":   # the group's pace (the broker sets the consumer protocol's): as bench.groups
        conf |= {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
    if instance_id:   # a static member: a restart takes its place back, so its session may be long
        conf |= {"group.instance.id": instance_id, "session.timeout.ms": 30_000}
    if session_ms:   # e.g. librdkafka's default (45 s), as an application leaves it
        conf["session.timeout.ms"] = int(session_ms)
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
        out.write("S %f\n" % time.time())
        while not stop:
            got = []
            for m in c.consume(200, 0.1):
                if m.error() is None:
                    got.append(m)
                elif m.error().code() not in _PASSING:
                    print(f"member: {m.error()}", file=sys.stderr)
            if not got:
                continue
            out.write("B %f\n" % time.time() + "".join(f"R {m.partition()} {m.offset()}\n" for m in got))
            try:
                c.commit(asynchronous=False)
                out.write("C\n")
            except KafkaException as e:
                print(f"member: commit failed: {e}", file=sys.stderr)
        c.close()


if __name__ == "__main__":
    main(*sys.argv[1:8])
