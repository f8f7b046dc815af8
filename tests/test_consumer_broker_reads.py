"""memq's Consumer reads hot parts through the brokers' read cache (`GET /v1/read`), on one
secured, governed two-broker cluster (real broker processes, ZooKeeper, moto S3, tansu):
three groups cost each broker at most one S3 GET per part; a principal without `consume` is
refused (no silent S3 read); a Consumer far behind reads S3 itself; a broker SIGKILLed while a
Consumer reads through it costs nothing lost or repeated. Damaged bytes from a broker:
`test_read_path_unit.py` (a fake broker) and the verify path."""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

from memq.client.consumer import Consumer
from memq.client.producer import Producer
from memq.config import ConsumerConfig, MemqConfig, TopicConfig
from memq.devcluster import DevCluster, GovernedCluster
from memq.devcluster.secure import DevSecurity, make_dev_security
from memq.errors import AuthorizationError
from memq.security.tls import client_context
from memq.security.tokens import new_token
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

BOB = "bob"   # may describe every topic, consume none


@pytest.fixture(scope="module")
def cluster(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[GovernedCluster, DevSecurity, str]]:
    """Two secured brokers; the dev principal may do anything, bob may only describe (his token yielded)."""
    tmp = tmp_path_factory.mktemp("broker-reads")
    dev = make_dev_security(tmp / "tls")
    bob_token, bob_entry = new_token(BOB)
    security = dataclasses.replace(dev, security=dataclasses.replace(
        dev.security, tokens=(*dev.security.tokens, str(bob_entry)), acls=(*dev.security.acls, f"allow {BOB} describe prefix:")))
    with GovernedCluster(tmp / "run", brokers=2, servers=devcluster, cluster=f"cbr-{uuid.uuid4().hex[:6]}",
                         session_timeout_s=2.0, security=security) as gc:
        yield gc, security, bob_token


def reader_config(gc: GovernedCluster, **consumer: object) -> MemqConfig:
    base = gc.config()
    return dataclasses.replace(base, consumer=ConsumerConfig(auto_offset_reset="earliest", **consumer))  # type: ignore[arg-type]


def make_topic(gc: GovernedCluster) -> str:
    topic = f"hot-{uuid.uuid4().hex[:6]}"
    gc.create_topic(TopicConfig(name=topic, read_partitions=2, batch_ms=20), brokers=2)
    return topic


def produce(config: MemqConfig, topic: str, values: list[bytes], per_part: int = 10) -> None:
    """`values` sent `per_part` at a time, each group acked (stored and notified) before the
    next: many small parts, from whichever broker the producer chose."""
    async def run() -> None:
        async with Producer(dataclasses.replace(config.producer, linger_ms=1)) as p:
            for i in range(0, len(values), per_part):
                await asyncio.gather(*[await p.send(topic, v) for v in values[i:i + per_part]])
    asyncio.run(run())


def read_all(consumer: Consumer, want: int, timeout_s: float = 60.0, stop: threading.Event | None = None,
             ) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and not (stop and stop.is_set()):
        assert time.monotonic() < deadline, f"read {len(got)} of {want}"
        got += [r.value for r in consumer.poll(0.5)]
    return got


def counted(gc: GovernedCluster, security: DevSecurity, series: str = "memq_broker_read_gets_total"
            ) -> dict[str, float]:
    """Each live broker's `series` so far (default: its S3 GETs for readers)."""
    ctx: ssl.SSLContext = client_context(security.ca_file, "", "")
    out = {}
    for bid in gc.live():
        text = urllib.request.urlopen(gc.broker(bid).url + "/metrics", timeout=10, context=ctx).read().decode()
        out[bid] = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series))
    return out


def test_three_groups_read_once_each_at_one_get_per_part_per_broker(
        cluster: tuple[GovernedCluster, DevSecurity, str]) -> None:
    gc, security, _ = cluster
    topic = make_topic(gc)
    config = reader_config(gc)
    values = [f"v{i}".encode() for i in range(300)]
    before = counted(gc, security)
    produce(config, topic, values)
    consumers = [Consumer(config, topic, group_id=f"g{i}-{topic}") for i in range(3)]
    results: dict[int, list[bytes]] = {}
    try:
        def run(i: int) -> None:
            results[i] = read_all(consumers[i], len(values))
        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        parts = {c.metrics.batches for c in consumers}
        for i, c in enumerate(consumers):
            assert sorted(results[i]) == sorted(values), f"group {i}: not exactly once"   # nothing lost or twice
            m = c.metrics
            assert m.parts_via_broker == m.batches and m.parts_via_s3 == 0 and m.broker_fallbacks == 0, m
            assert m.broker_bytes == m.bytes
    finally:
        for c in consumers:
            c.close()
    [batches] = parts   # each group read the same parts
    after = counted(gc, security)
    gets = {b: after[b] - before.get(b, 0.0) for b in after}
    # each broker GETs a part at most once whatever the groups (the writer none: it holds it hot)
    assert all(n <= batches for n in gets.values()), (gets, batches)
    assert sum(gets.values()) <= batches, (gets, batches)


def test_a_principal_without_consume_is_refused_not_served_from_s3(
        cluster: tuple[GovernedCluster, DevSecurity, str]) -> None:
    gc, _, bob_token = cluster
    topic = make_topic(gc)
    produce(reader_config(gc), topic, [b"secret"], per_part=1)
    bob = reader_config(gc)
    bob = dataclasses.replace(bob, producer=dataclasses.replace(bob.producer, token=bob_token))
    with Consumer(bob, topic, group_id=f"bob-{topic}") as c:
        def refused() -> str | None:
            try:
                list(c.poll(0.5))
            except AuthorizationError as e:
                return str(e)
            return None
        why = wait_for(refused, 60, "the broker's refusal")
        assert f"principal {BOB} may not consume topic {topic}" in why
        assert c.metrics.parts_via_s3 == 0 and c.metrics.records == 0


def test_the_read_door_serves_a_topics_own_objects_only(cluster: tuple[GovernedCluster, DevSecurity, str]) -> None:
    """Even a principal that may consume everything gets only the named topic's objects, within bounds."""
    gc, security, _ = cluster
    config = gc.config()

    def status(**query: str) -> int:
        url = gc.broker("b2").url + "/v1/read?" + urllib.parse.urlencode(query)
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {config.producer.token}"})
        try:
            with urllib.request.urlopen(request, timeout=10, context=client_context(security.ca_file, "", "")) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return e.code
    topic = make_topic(gc)
    other = f"ab/{gc.cluster}/topics/other-topic/0000000000001-b1-ff-a0"
    bucket = config.s3.bucket
    assert status(topic=topic, bucket=bucket, key=other, offset="0", size="10") == 404
    assert status(topic=topic, bucket=bucket, key="../../etc/passwd", offset="0", size="10") == 404
    assert status(topic=topic, bucket=bucket, key=other.replace("other-topic", topic), offset="0", size=str(1 << 30)) == 400
    assert status(topic=topic, bucket=bucket, key=other.replace("other-topic", topic), offset="0", size="10") == 404   # missing


def test_a_consumer_far_behind_reads_s3_itself(cluster: tuple[GovernedCluster, DevSecurity, str]) -> None:
    gc, security, _ = cluster
    topic = make_topic(gc)
    values = [f"old{i}".encode() for i in range(50)]
    produce(reader_config(gc), topic, values)
    time.sleep(1.0)   # every part older than the threshold below
    before = counted(gc, security)
    with Consumer(reader_config(gc, broker_read_max_age_ms=500), topic, group_id=f"late-{topic}") as c:
        assert sorted(read_all(c, len(values))) == sorted(values)
        assert c.metrics.parts_via_s3 == c.metrics.batches > 0 and c.metrics.parts_via_broker == 0
    assert counted(gc, security) == before   # no broker was asked


def test_a_broker_killed_mid_read_loses_and_repeats_nothing(cluster: tuple[GovernedCluster, DevSecurity, str]) -> None:
    gc, security, _ = cluster
    topic = make_topic(gc)
    config = reader_config(gc, prefetch_bytes=1, fetch_concurrency=1)   # one part ahead: most are read after the kill
    values = [f"k{i}".encode() for i in range(400)]
    produce(dataclasses.replace(config, producer=dataclasses.replace(config.producer, brokers=gc.broker("b1").url)),
            topic, values)   # b1 stored every part: it serves them, from memory
    served = 'memq_broker_part_reads_total{result="ok"}'
    with Consumer(config, topic, group_id=f"kill-{topic}") as c:
        got = read_all(c, 100)
        assert c.metrics.parts_via_broker > 0
        b2_before = counted(gc, security, served)["b2"]
        gc.kill_broker("b1")
        got += read_all(c, len(values) - len(got))
        m = c.metrics
    assert sorted(got) == sorted(values)   # nothing lost, nothing twice
    assert m.parts_via_broker + m.parts_via_s3 == m.batches
    assert counted(gc, security, served)["b2"] > b2_before   # went on through the other broker
