"""Quix Streams, exactly-once, on memq (moto S3, tansu, ZooKeeper, two governed brokers with
listeners): an application counts each key of a 2-partition topic in its State (RocksDB with the
compacted changelog topic Quix creates through the admin API) and produces every key's running
count to an output topic, its offsets, changelog and output in one transaction. It is SIGKILLed
mid-way, more input arrives, and it restarts with an empty state directory, so its counts come
back from the changelog alone. Kafka's exactly-once contract, read with read_committed: every
input is counted once, each key's counts in the output are 1, 2, ..., its inputs, with no count
twice or missing, its changelog ends at its inputs, and its group's commits reach the input's end.

quixstreams pins a confluent-kafka older than memq's, so the application runs in a virtualenv of
its own (tests/support/quix_venv.py) and imports no memq."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from memq.devcluster import DevCluster
from tests.support.quix_venv import quix_python  # noqa: F401  # the fixture
from tests.support.stream_apps import kafka_cluster, lag, read_to_end
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(600)]

APP = Path(__file__).with_name("support") / "quix_counter.py"
KEYS = [f"k{i}" for i in range(10)]
FIRST, SECOND = 600, 400
DELAY_S = 0.01         # per record in the application: the first run takes several seconds, many commits
KILL_AFTER = 150       # committed outputs before the SIGKILL
STARTED_S = 90.0       # the application creates its topics, joins its group and commits its first outputs
DONE_S = 120.0         # the restart joins (the killed member's 6 s session), restores its state, counts the rest


@pytest.fixture(scope="module")
def address(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with kafka_cluster(devcluster, tmp_path_factory.mktemp("quix"), "quix") as addr:
        yield addr


def produce(address: str, topic: str, start: int, n: int) -> None:
    p = Producer({"bootstrap.servers": address, "acks": "all", "linger.ms": 5})
    for i in range(start, start + n):
        p.produce(topic, key=KEYS[(i * 7) % len(KEYS)], value=json.dumps(i))
    assert p.flush(60) == 0


class App:
    """One Quix application process, in the Quix venv."""

    def __init__(self, python: Path, argv: list[str], log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen([str(python), str(APP), *argv], stdout=log.open("ab"), stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        assert self.proc.poll() is None, f"the application exited ({self.proc.returncode}): {self.tail()}"
        return True

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            (self.proc.kill if kill else self.proc.terminate)()
        self.proc.wait(30)


def outputs(address: str, sink: str) -> list[dict[str, object]]:
    return [json.loads(v) for _, _, v in read_to_end(address, sink, 1)]


def test_quix_exactly_once_counts_every_key_once_across_a_sigkill(
        address: str, quix_python: Path, tmp_path: Path) -> None:  # noqa: F811
    tag = uuid.uuid4().hex[:6]
    group, source, sink = f"quix-{tag}", f"events-{tag}", f"counts-{tag}"
    admin = AdminClient({"bootstrap.servers": address})
    admin.create_topics([NewTopic(source, 2)])[source].result(30)
    produce(address, source, 0, FIRST)
    per_partition = Counter(p for p, _, _ in read_to_end(address, source, 2))
    assert per_partition[0] > 0 and per_partition[1] > 0, per_partition   # keys on both partitions

    def start(run: str) -> App:   # each run an empty state directory: its state comes from the changelog
        argv = [address, group, source, sink, str(tmp_path / f"state-{run}"), str(DELAY_S)]
        return App(quix_python, argv, tmp_path / "app.log")

    app = start("first")
    try:
        def started() -> bool:
            return app.alive() and sink in admin.list_topics(timeout=10).topics and \
                len(outputs(address, sink)) >= KILL_AFTER
        wait_for(started, STARTED_S, f"{KILL_AFTER} committed outputs", interval_s=0.5)
    finally:
        app.stop(kill=True)   # SIGKILL, a transaction perhaps open
    at_kill = len(outputs(address, sink))
    assert at_kill < FIRST, f"the SIGKILL came after all {FIRST} inputs were counted: {at_kill}"

    produce(address, source, FIRST, SECOND)
    app = start("restart")
    try:
        def caught_up() -> bool:
            return app.alive() and lag(address, group, source) == [0, 0]
        wait_for(caught_up, DONE_S, f"the group's commits to reach the input's end: {app.tail()}", interval_s=0.5)
    finally:
        app.stop()

    expected = Counter(KEYS[(i * 7) % len(KEYS)] for i in range(FIRST + SECOND))
    got = outputs(address, sink)
    counts: dict[str, list[int]] = defaultdict(list)
    inputs: dict[str, list[int]] = defaultdict(list)
    for out in got:
        counts[str(out["key"])].append(int(out["count"]))  # type: ignore[call-overload]
        inputs[str(out["key"])].append(int(out["input"]))  # type: ignore[call-overload]
    assert len(got) == FIRST + SECOND, f"{len(got)} committed outputs for {FIRST + SECOND} inputs"
    for key, n in expected.items():
        assert counts[key] == list(range(1, n + 1)), f"{key}: counts {counts[key]} for {n} inputs"
        assert inputs[key] == [i for i in range(FIRST + SECOND) if KEYS[(i * 7) % len(KEYS)] == key], key
    changelogs = [t for t in admin.list_topics(timeout=10).topics if t.startswith("changelog__") and group in t]
    assert len(changelogs) == 1, changelogs
    latest: dict[str, int | None] = {}   # a state key: the message key, "|", the state's key ("count"), as JSON
    for _, k, v in read_to_end(address, changelogs[0], 2):
        prefix, _, name = (k or b"").partition(b"|")
        assert json.loads(name) == "count", k
        latest[json.loads(prefix)] = None if v is None else json.loads(v)
    assert latest == dict(expected), "the changelog ends at each key's count of inputs"
    print(f"quix exactly-once: {len(got)} outputs, {at_kill} committed before the SIGKILL, "
          f"counts {dict(sorted(expected.items()))}")
