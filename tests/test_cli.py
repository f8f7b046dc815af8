"""The `memq` command through its console-script entry point, against real servers."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka import Consumer as KafkaConsumer

from memq.audit.records import AuditRecord, Kind, decode_records
from memq.config import BrokerConfig, MemqConfig, TopicConfig, load_config, memq_topic_of
from memq.devcluster import DevCluster
from memq.devcluster.broker_process import BrokerProcess, config_toml
from memq.errors import ConfigError
from memq.governor.registry import Registry
from memq.notify import TopicAdmin
from tests.support.cli import MEMQ, consume_until, memq, processes_under, start_dev, stop_dev

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def served(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A broker process hosting one topic, and a client config file naming it."""
    name = f"cli-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path_factory.mktemp("cli")
    config = devcluster.config(topics=[TopicConfig(name=name, read_partitions=2)])
    with BrokerProcess(dataclasses.replace(config, broker=BrokerConfig(broker_id="cli")), run_dir) as broker:
        client: MemqConfig = dataclasses.replace(config, producer=dataclasses.replace(config.producer, brokers=broker.url))
        path = run_dir / "client.toml"
        path.write_text(config_toml(client))
        yield path, name


@pytest.mark.timeout(60)
def test_bad_or_missing_setting_exits_2_naming_it(tmp_path: Path) -> None:
    r = memq("consume", "t", env={"MEMQ_CONSUMER_PREFETCH_BYTES": "lots"})
    assert r.returncode == 2 and b"consumer.prefetch_bytes" in r.stderr
    r = memq("produce", "t", input=b"x\n")
    assert r.returncode == 2 and b"producer.brokers" in r.stderr
    r = memq("status", config=tmp_path / "nope.toml")
    assert r.returncode == 2 and b"nope.toml" in r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[consumer]\nno_such_setting = 1\n")
    r = memq("consume", "t", config=bad)
    assert r.returncode == 2 and b"no_such_setting" in r.stderr


@pytest.mark.timeout(120)
def test_produce_then_consume_round_trip(served: tuple[Path, str]) -> None:
    path, topic = served
    lines = [f"key{i}\tline {i} {'x' * (i % 50)}" for i in range(3000)]
    r = memq("produce", topic, "--keys", "--ack", "all", config=path, input=("\n".join(lines) + "\n").encode())
    assert r.returncode == 0, r.stderr.decode()
    assert b"3,000 messages" in r.stderr
    group = f"g-{uuid.uuid4().hex[:6]}"
    r = memq("consume", topic, "--group", group, "--keys", "--max-messages", "3000", "--idle-timeout", "20",
             config=path)
    assert r.returncode == 0, r.stderr.decode()
    got = r.stdout.decode().splitlines()
    assert sorted(got) == sorted(lines)             # partitions interleave; each line exactly once
    # the group committed: nothing left for it
    r = memq("consume", topic, "--group", group, "--idle-timeout", "2", config=path)
    assert r.returncode == 0 and r.stdout == b""
    # generated load, counted
    r = memq("produce", topic, "--generate", "5000", "--size", "64", config=path)
    assert r.returncode == 0, r.stderr.decode()
    r = memq("consume", topic, "--group", group, "--count", "--max-messages", "5000", "--idle-timeout", "20",
             config=path)
    assert r.returncode == 0 and b"5,000 messages" in r.stderr, r.stderr.decode()
    # both commands emitted audit records (flushed before they exited)
    records = [r for r in audit_records(load_config(path)) if r.topic == topic]
    assert sum(r.count for r in records if r.kind == Kind.PRODUCED) == 3000 + 5000
    assert sum(r.count for r in records if r.kind == Kind.CONSUMED and r.group == group) == 3000 + 5000


def audit_records(config: MemqConfig, timeout_s: float = 30) -> list[AuditRecord]:
    """Every record on the cluster's audit topic, read from the beginning to the high watermarks."""
    name = config.audit.topic_for(config.cluster.name)
    c = KafkaConsumer({"bootstrap.servers": config.kafka.bootstrap_servers, "group.id": f"v-{uuid.uuid4().hex}",
                       "enable.auto.commit": False})
    try:
        parts = list(c.list_topics(name, timeout=10).topics[name].partitions)
        high = {p: c.get_watermark_offsets(TopicPartition(name, p), timeout=10)[1] for p in parts}
        c.assign([TopicPartition(name, p, OFFSET_BEGINNING) for p in parts])
        pos = dict.fromkeys(parts, 0)
        out: list[AuditRecord] = []
        deadline = time.monotonic() + timeout_s
        while any(pos[p] < high[p] for p in parts):
            assert time.monotonic() < deadline, f"audit topic not read within {timeout_s}s: {pos} of {high}"
            for m in c.consume(500, 0.5):
                if m.error() is None:
                    out.extend(decode_records(m.value())[1])
                    pos[m.partition()] = m.offset() + 1
        return out
    finally:
        c.close()


@pytest.mark.timeout(60)
def test_status_shows_brokers_and_fails_when_one_is_down(served: tuple[Path, str]) -> None:
    path, topic = served
    r = memq("status", config=path)
    assert r.returncode == 0, r.stderr.decode()
    assert b"broker cli" in r.stdout and topic.encode() in r.stdout and b"kafka" in r.stdout
    r = memq("status", "--brokers", "http://127.0.0.1:9", config=path)   # nothing listens there
    assert r.returncode == 1 and b"down" in r.stdout


@pytest.mark.timeout(90)
def test_broker_command_serves_until_sigterm(devcluster: DevCluster, tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    config = devcluster.config(topics=[TopicConfig(name=f"bk-{uuid.uuid4().hex[:6]}")])
    path.write_text(config_toml(dataclasses.replace(config, broker=BrokerConfig(broker_id="clib"))))
    proc = subprocess.Popen([MEMQ, "broker", "--config", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        url = re.search(r"listening on (\S+)", line)
        assert url, line
        with urllib.request.urlopen(url.group(1) + "/healthz", timeout=5) as resp:
            assert resp.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.timeout(60)
def test_topic_commands(devcluster: DevCluster, tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    config = devcluster.config(cluster="clitopics")
    path.write_text(config_toml(config))
    TopicAdmin(config.kafka).create_topic(config.audit.topic_for("clitopics"), 1)   # memq.clitopics.__audit
    name = f"tt-{uuid.uuid4().hex[:6]}"
    r = memq("topic", "create", name, "--partitions", "4", config=path)
    assert r.returncode == 0, r.stderr.decode()
    names = memq("topic", "list", config=path).stdout.decode().split()
    assert name in names and "__audit" not in names
    status = memq("status", config=path).stdout.decode()
    assert f"{len(names)} memq topics" in status, status
    out = memq("topic", "describe", name, config=path).stdout.decode()
    assert re.search(r"\b3\W+0\W+0\W+0\b", out), out     # partition 3 exists and is empty
    r = memq("topic", "delete", name, "--yes", config=path)
    assert r.returncode == 0, r.stderr.decode()
    assert name not in memq("topic", "list", config=path).stdout.decode().split()


def test_internal_topic_names_are_reserved() -> None:
    with pytest.raises(ConfigError, match="'__audit'.*reserved"):
        TopicConfig(name="__audit")
    assert memq_topic_of("memq.c1.orders", "c1") == "orders"
    assert memq_topic_of("memq.c1.__audit", "c1") is None
    assert memq_topic_of("memq.c2.orders", "c1") is None


def test_topic_create_settings_give_a_compacted_topic_objects_of_its_own_unless_a_group_is_chosen() -> None:
    from memq.cli.topic import topic_config

    assert topic_config(MemqConfig(), "s", 1, ("cleanup_policy=compact",)).storage_group == ""
    chosen = topic_config(MemqConfig(), "s", 1, ("cleanup_policy=compact", "storage_group=state"))
    assert chosen.storage_group == "state"
    filed = MemqConfig(topics=(TopicConfig("s", read_partitions=1, storage_group="g"),))
    assert topic_config(filed, "s", None, ("cleanup_policy=compact",)).storage_group == "g"   # the config file's
    assert topic_config(MemqConfig(), "p", None, ()).storage_group == TopicConfig("p").storage_group


def _governed(config: Path, topic: str) -> tuple[str, dict[str, str]]:
    """The governor named by `memq governor status`, and `topic`'s brokers -> racks from ZooKeeper."""
    r = memq("governor", "status", config=config)
    assert r.returncode == 0, r.stderr.decode()
    gov = re.search(r"governor: (\w+)", r.stdout.decode())
    assert gov, r.stdout.decode()
    cfg = load_config(config)
    with Registry(cfg.zookeeper, cfg.cluster.name) as registry:
        state = registry.snapshot()
    return gov[1], {b: state.brokers[b].rack for b in state.assignments.get(topic, ())}


@pytest.mark.timeout(240)
def test_memq_dev_serves_a_first_hour_and_stops_clean(tmp_path: Path) -> None:
    """One `memq dev` (2 brokers, demo traffic) for what a first hour does on it: governed placement
    over two racks, a round trip, the cost view, `memq topic create` topics placed and their clashes
    explained, and the `try:` lines it prints run as printed from a shell without the virtualenv.
    (One broker's placement note, no failover, is `_placement_line`'s unit test.)"""
    run_dir = (tmp_path / "dev").resolve()
    proc, endpoints = start_dev(run_dir, "--rate", "200")
    try:
        assert {"S3", "Kafka", "ZooKeeper", "brokers", "governor", "placement", "audit"} <= endpoints.keys()
        assert "no failover" not in endpoints["placement"], endpoints
        audit = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/", endpoints["audit"])
        assert audit and int(audit[1]) != 8090, endpoints["audit"]      # a free port, not a fixed one
        with urllib.request.urlopen(endpoints["audit"], timeout=10) as resp:
            assert resp.status == 200
        config = Path(endpoints["config"])
        # governed: a broker won the election and placed the demo topic on 2 brokers of 2 racks
        governor, placed = _governed(config, "demo")
        assert governor in {"b1", "b2"} and endpoints["governor"].startswith(governor), endpoints
        assert sorted(placed) == ["b1", "b2"] and len(set(placed.values())) == 2, placed
        _try_lines_run_from_a_shell(endpoints["try"].splitlines())
        marker = uuid.uuid4().hex
        r = memq("produce", "demo", config=config, input=f"{marker} one\n{marker} two\n".encode())
        assert r.returncode == 0, r.stderr.decode()
        values = consume_until(config, "demo", {f"{marker} one", f"{marker} two"})
        assert any(v.startswith("demo message") for v in values)     # the demo producer runs
        # the cost view: the demo topic and its batched twin, each against its break-even
        cost = memq("cost", config=config)
        assert cost.returncode == 0, cost.stderr.decode()
        shown = cost.stdout.decode()
        assert "demo-batched" in endpoints["placement"] and re.search(r"(?m)^demo-batched: ", shown), shown
        assert shown.count("break-even: ") == len(re.findall(r"(?m)^[\w.-]+: in [\d,]+ s", shown)) >= 2, shown

        r = memq("topic", "create", "events", "-p", "4", config=config, timeout=90)
        assert r.returncode == 0, r.stderr.decode()
        assert "4 read partitions" in r.stdout.decode() and re.search(r"served by b[12]", r.stdout.decode())
        assert "events" in memq("topic", "list", config=config).stdout.decode().split()
        r = memq("produce", "events", config=config, input=b"first\nsecond\n")
        assert r.returncode == 0, r.stderr.decode()
        assert set(consume_until(config, "events", {"first", "second"})) == {"first", "second"}
        again = memq("topic", "create", "events", "-p", "4", config=config)        # idempotent
        assert again.returncode == 0, again.stderr.decode()
        alias = memq("governor", "topic", "create", "orders", "-p", "2", config=config, timeout=90)
        assert alias.returncode == 0 and re.search(r"served by b[12]", alias.stdout.decode()), alias.stderr.decode()
        cfg = load_config(config)
        TopicAdmin(cfg.kafka).create_topic(f"memq.{cfg.cluster.name}.stale", 2)   # made by hand
        clash = memq("topic", "create", "stale", "-p", "4", config=config)
        err = clash.stderr.decode()
        assert clash.returncode == 1 and "already has 2 partitions, not 4" in err and "-p 2" in err, err
        assert "memq governor topic delete stale --delete-notifications" in err
        assert processes_under(run_dir)                              # (the check below can see them)
    finally:
        tail = stop_dev(proc, run_dir)
    assert re.search(r"consumed [1-9]", tail), tail            # the live demo counts


def test_one_brokers_placement_says_it_has_no_failover() -> None:
    from memq.cli.dev import _placement_line

    class Racks:
        def rack(self, broker: str) -> str:
            return {"b1": "rack-a", "b2": "rack-b"}[broker]

    one = _placement_line("demo", ("b1",), Racks())  # type: ignore[arg-type]
    assert one.startswith("demo on b1 (rack-a)") and "no failover (use --brokers 2 or more)" in one
    two = _placement_line("demo", ("b1", "b2"), Racks())  # type: ignore[arg-type]
    assert two == "demo on b1 (rack-a), b2 (rack-b)"


def _try_lines_run_from_a_shell(tried: list[str]) -> None:
    """`memq dev`'s try: lines (consume, produce, kcat) as a new user pastes them: a shell with no
    virtualenv on its PATH and no MEMQ_ settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_") and k not in ("PATH", "VIRTUAL_ENV")}
    clean["PATH"] = "/usr/bin:/bin"
    consume, produce, kcat = tried[:3]
    r = subprocess.run(["sh", "-c", produce], capture_output=True, timeout=60, env=clean)
    assert r.returncode == 0, (produce, r.stderr.decode())
    wanted = 1
    if shutil.which("kcat", path=clean["PATH"]):   # the brokers' Kafka listener takes any Kafka producer
        r = subprocess.run(["sh", "-c", kcat], capture_output=True, timeout=60, env=clean)
        assert r.returncode == 0, (kcat, r.stderr.decode())
        wanted = 2
    r = subprocess.run(["sh", "-c", consume + f" -n {wanted} --idle-timeout 30"], capture_output=True, timeout=90,
                       env=clean)
    assert r.returncode == 0, (consume, r.stderr.decode())
    assert re.search(rb"(?m)^%d messages from demo" % wanted, r.stderr), r.stderr


def test_ctrl_c_asks_memq_consume_to_stop_between_records_and_a_second_interrupts() -> None:
    from memq.cli.consume import _stop_on_signals

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)   # a terminal's (the test process may differ)
        stop = _stop_on_signals()
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while not stop.is_set() and time.monotonic() < deadline:   # the handler runs between bytecodes
            time.sleep(0.01)
        assert stop.is_set()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        signal.signal(signal.SIGINT, signal.SIG_IGN)      # a background job's: stays ignored
        _stop_on_signals()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
