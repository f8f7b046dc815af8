"""The dashboard's cost panel data (/api/cost) from a broker's live counters: an in-process broker
with file storage (no Kafka), the dashboard app on a real socket, the Producer on the real path."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import urllib.error
import urllib.request
from pathlib import Path

from aiohttp import web
from tests.support.inproc import broker_in_thread

from memq.audit.auditor import Auditor
from memq.audit.dashboard import make_app
from memq.client.producer import Producer
from memq.config import BrokerConfig, MemqConfig, ProducerConfig, StorageConfig, TopicConfig


async def serve_and_get(config: MemqConfig, tmp_path: Path, query: str) -> tuple[int, dict[str, object]]:
    runner = web.AppRunner(make_app(Auditor(config, db_path=str(tmp_path / "audit.db"))))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]

    def get() -> tuple[int, dict[str, object]]:
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/api/cost{query}", timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            return e.code, json.loads(text) if e.headers.get_content_type() == "application/json" else {"text": text}

    try:
        return await asyncio.to_thread(get)
    finally:
        await runner.cleanup()


async def test_api_cost_prices_what_the_broker_stored(tmp_path: Path) -> None:
    config = MemqConfig(storage=StorageConfig(kind="file", root_dir=str(tmp_path / "objects")),
                        broker=BrokerConfig(port=0), topics=(TopicConfig("orders"),))
    with broker_in_thread(config) as url:
        async with Producer(ProducerConfig(brokers=url)) as producer:
            for _ in range(3):          # three flushes: three objects
                await asyncio.gather(*[await producer.send("orders", b"x" * 1000) for _ in range(10)])
                await producer.flush()
        client = dataclasses.replace(config, producer=ProducerConfig(brokers=url))
        status, body = await serve_and_get(client, tmp_path, "?retention_days=1")
        bad, _ = await serve_and_get(client, tmp_path, "?retention_days=x")
    assert status == 200 and bad == 400
    assert body["brokers"] == [url] and body["retention_days"] == 1 and "S3 Standard" in str(body["prices"])
    orders = body["topics"]["orders"]    # type: ignore[index]
    stored = len([p for p in (tmp_path / "objects").rglob("*") if p.is_file()])
    assert orders["counts"]["objects"] == orders["counts"]["requests"]["put"] == stored == 3
    assert orders["memq_usd_month"] > 0 and orders["compaction"] is None     # a plain topic
    # its break-even, from the settings the broker reports for it (memq_broker_topic_settings)
    be = orders["break_even"]
    assert be["settings"] == {"batch_bytes": 8 * 2**20, "batch_ms": 250, "min_batch_bytes": 0, "max_batch_ms": 250,
                              "group": "shared", "brokers": 1}
    assert be["now_mib_s"] > 0 and be["break_even_mib_s"] > be["now_mib_s"] and not be["above"]
    assert be["suggestions"] and all(s["memq_usd_month"] < be["memq_usd_month"] for s in be["suggestions"])


async def test_api_cost_says_when_no_broker_answers(tmp_path: Path) -> None:
    client = MemqConfig(producer=ProducerConfig(brokers="http://127.0.0.1:1"))
    status, body = await serve_and_get(client, tmp_path, "")
    assert status == 200 and "cannot connect to broker http://127.0.0.1:1" in str(body["error"])


def test_schema_panel_sums_each_topics_invalid_records_over_brokers() -> None:
    from memq.audit.schema_panel import invalid_counts
    one = ('# TYPE memq_broker_schema_invalid_records_total counter\n'
           'memq_broker_schema_invalid_records_total{topic="a",action="reject"} 2.0\n'
           'memq_broker_schema_invalid_records_total{topic="b",action="dlq"} 1.0\n')
    two = ('# TYPE memq_broker_schema_invalid_records_total counter\n'
           'memq_broker_schema_invalid_records_total{topic="a",action="reject"} 3.0\n'
           'memq_broker_other_total 7.0\n')
    assert invalid_counts([one, two]) == {"a": {"reject": 5.0, "dlq": 0.0, "warn": 0.0},
                                          "b": {"reject": 0.0, "dlq": 1.0, "warn": 0.0}}
    from memq.audit.schema_panel import read_metrics
    settings = ('# TYPE memq_broker_topic_schema_checks gauge\n'
                'memq_broker_topic_schema_checks{topic="a",part="value",action="reject"} 1.0\n'
                'memq_broker_topic_schema_checks{topic="a",part="key",action="reject"} 1.0\n')
    assert read_metrics([one, settings])[1] == {"a": {"value": "reject", "key": "reject"}}
