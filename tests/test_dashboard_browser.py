"""The audit dashboard in a real headless chromium (Debian's, driven by Playwright).

Injected loss must be visible on the page, the charts must hold data points, the cost panel
must show each topic against its break-even (an in-process broker on file storage serves the
counters), the schema panel each checked topic's schema and the records it refused or
dead-lettered, and the page must log no console errors. The screenshot is kept in test-artifacts/
for people to look at.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.support.audit import GRACE_S, audit_config, emit_traffic
from tests.support.inproc import broker_in_thread
from tests.support.waiting import async_wait_for

from memq.audit.dashboard import AuditService
from memq.audit.emitter import make_audit_sink
from memq.client.producer import Producer
from memq.client.serde import Serde
from memq.config import BrokerConfig, MemqConfig, ProducerConfig, StorageConfig, TopicConfig
from memq.errors import InvalidRecordError

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = [
    pytest.mark.integration, pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason="chromium not found (scripts/test.sh installs Debian's chromium)"),
]


async def test_dashboard_shows_injected_loss(memq_config: MemqConfig, unique_name: Callable[[str], str],
                                             tmp_path: Path) -> None:
    # the cost panel's counters: one broker, a busy topic (above its break-even) and a trickle of
    # small Messages (below it: 4 objects a second, which a longer batch_ms would cut), each with
    # objects of its own
    busy_topic, trickle_topic = unique_name("busy"), unique_name("trickle")
    # the schema panel: a topic refusing what fails its checks and one dead-lettering it
    strict, lenient = unique_name("strict"), unique_name("lenient")
    checked = (TopicConfig(strict, value_schema_validation=True),
               TopicConfig(lenient, value_schema_validation=True, schema_validation_action="dlq"),
               TopicConfig(f"{lenient}.dlq"))
    served = MemqConfig(storage=StorageConfig(kind="file", root_dir=str(tmp_path / "objects")),
                        broker=BrokerConfig(port=0),
                        topics=(TopicConfig(busy_topic, storage_group=""), TopicConfig(trickle_topic, storage_group=""),
                                *checked))
    with broker_in_thread(served) as broker_url:
        await _refuse_and_dead_letter(ProducerConfig(brokers=broker_url, linger_ms=1), strict, lenient)
        async with Producer(ProducerConfig(brokers=broker_url)) as producer:
            acks = [await producer.send(busy_topic, os.urandom(64 * 1024)) for _ in range(256)]
            for _ in range(100):                    # one Message each (linger_ms 5)
                acks.append(await producer.send(trickle_topic, b"tick"))
                await asyncio.sleep(0.02)
            await asyncio.gather(*acks)
        cfg = dataclasses.replace(audit_config(memq_config, unique_name), producer=ProducerConfig(brokers=broker_url))
        await _show_loss_and_cost(cfg, tmp_path, unique_name, busy_topic, trickle_topic, (strict, lenient))


async def _refuse_and_dead_letter(pc: ProducerConfig, strict: str, lenient: str) -> None:
    """`strict` refuses 2 records (2 Messages), `lenient` dead-letters 3 (one Message); both store a good one."""
    serde = Serde(pc)
    schema = json.dumps({"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]})
    frame = {t: await asyncio.to_thread(serde.serializer, f"{t}-value", schema) for t in (strict, lenient)}
    async with Producer(pc) as producer:
        for _ in range(2):
            with pytest.raises(InvalidRecordError):
                await (await producer.send(strict, b"not framed"))
        await (await producer.send(strict, frame[strict]({"id": 1})))
        acks = [await producer.send(lenient, v) for v in (b"x", frame[lenient]({"id": 2}), b"y", b"z")]
        await asyncio.gather(*acks)


async def _show_loss_and_cost(cfg: MemqConfig, tmp_path: Path, unique_name: Callable[[str], str],
                              busy_topic: str, trickle_topic: str, checked: tuple[str, str]) -> None:
    from playwright.async_api import async_playwright

    em = make_audit_sink(cfg)
    assert em is not None
    healthy, lossy = unique_name("healthy"), unique_name("lossy")
    emit_traffic(em, healthy, "app", messages=30, count=10)
    emit_traffic(em, lossy, "app", messages=30, count=10, lose=range(5, 9))
    em.close()
    service = AuditService(cfg, db_path=str(tmp_path / "audit.db"), port=0)
    url = await service.start()
    try:
        await async_wait_for(lambda: service.auditor.stats().records == 30 * 2 + 30 + 26, 20, "records")
        await asyncio.sleep(GRACE_S + 1.0)
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=30_000)
            try:
                page = await browser.new_page(viewport={"width": 1500, "height": 1100})
                errors: list[str] = []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                await page.goto(url, timeout=20_000)
                await page.wait_for_function(
                    f"window.memqCharts[{lossy!r}] && window.memqCharts[{healthy!r}]", timeout=15_000)
                await page.wait_for_timeout(500)

                first = page.locator("#summary tbody tr").first
                assert await first.get_attribute("data-topic") == lossy          # worst first
                lost_cell = page.locator(f'#summary tr[data-topic="{lossy}"] td.lost')
                assert await lost_cell.inner_text() == "40"
                assert "bad" in (await lost_cell.get_attribute("class") or "")
                assert await page.locator(f'#summary tr[data-topic="{lossy}"] .status').inner_text() == "LOSS"
                assert await page.locator(f'#summary tr[data-topic="{healthy}"] td.lost').inner_text() == "0"

                points = await page.evaluate("""(t) => {
                    const c = window.memqCharts[t];
                    const count = (u) => u.data.slice(1).map(s => s.filter(v => v !== null && v !== 0).length);
                    return {x: c.rate.data[0].length, rate: count(c.rate), latency: count(c.latency),
                            lost: c.rate.data[3].reduce((a, b) => a + b, 0)};
                }""", lossy)
                assert points["x"] >= 1
                assert all(n >= 1 for n in points["rate"]), points      # produced, consumed, lost
                assert all(n >= 1 for n in points["latency"]), points
                assert points["lost"] == 40
                assert await page.locator("canvas").count() >= 6         # 3 charts per topic

                # The x axis is fitted to the data (not a fixed 15-minute span with every point
                # squashed at its right edge), and each latency value is drawn as a point inside
                # the plot area, so even a single window of data is visible.
                drawn = await page.evaluate("""(t) => {
                    const c = window.memqCharts[t];
                    const x = c.latency.scales.x, y = c.latency.scales.y;
                    const inside = c.latency.series.slice(1).map((s, i) => {
                        const ys = c.latency.data[i + 1];
                        const j = ys.findIndex(v => v !== null);
                        const tx = c.latency.data[0][j];
                        return j >= 0 && s.show && s.points.show(c.latency, i + 1) === true && s.points.size >= 5
                            && tx >= x.min && tx <= x.max && ys[j] >= y.min && ys[j] <= y.max;
                    });
                    return {first: c.rate.data[0][0], xmin: x.min, xmax: x.max, now: Date.now() / 1000,
                            inside, legend: [...c.latency.root.querySelectorAll(
                                ".u-legend .u-series td.u-value")].map(e => e.textContent)};
                }""", lossy)
                assert all(drawn["inside"]), drawn
                assert 0 < drawn["first"] - drawn["xmin"] <= 120, drawn
                assert drawn["xmax"] - drawn["xmin"] <= 5 * 60, drawn
                assert abs(drawn["xmax"] - drawn["now"]) <= 30, drawn
                # The legend shows the latest figures without hovering: p50 matches the table.
                p50 = await page.locator(f'#summary tr[data-topic="{lossy}"] td').nth(10).inner_text()
                assert drawn["legend"][1] == p50, drawn      # [0] is the time of the latest window

                # the cost panel: each topic's rate now, its break-even (green above it, red below),
                # and below it the changes that would cut its cost with their monthly figures
                await page.wait_for_selector(f'#cost tr[data-topic="{trickle_topic}"]', timeout=15_000)
                busy, trickle = (page.locator(f'#cost tr[data-topic="{t}"] td') for t in (busy_topic, trickle_topic))
                assert await busy.nth(12).get_attribute("class") == "above"
                assert await trickle.nth(12).get_attribute("class") == "below"
                assert float(await trickle.nth(12).inner_text()) > float(await trickle.nth(11).inner_text()) > 0
                assert await busy.nth(13).inner_text() == ""
                ideas = await trickle.nth(13).inner_text()
                assert ideas.startswith("batch_ms=") and ": $" in ideas, ideas
                assert "at the broker" in (await trickle.nth(13).locator("div").first.get_attribute("title") or "")

                # the schema panel: each checked topic's schema, its refused and dead-lettered records
                strict, lenient = checked
                await page.wait_for_selector(f'#schemas tr[data-topic="{lenient}"]', timeout=15_000)
                row = {t: page.locator(f'#schemas tr[data-topic="{t}"] td') for t in checked}
                assert await row[strict].nth(1).inner_text() == "value: reject"
                assert await row[lenient].nth(1).inner_text() == "value: dlq"
                assert await row[strict].nth(2).inner_text() == "AVRO v1 (id 1)"
                assert await row[lenient].nth(2).inner_text() == "AVRO v1 (id 1)"   # one schema, one id
                assert await row[strict].nth(3).inner_text() == "–"                # no key schema
                assert [await row[strict].nth(i).inner_text() for i in (4, 5, 6)] == ["2", "0", "0"]
                assert [await row[lenient].nth(i).inner_text() for i in (4, 5, 6)] == ["0", "3", "0"]
                assert "bad" in (await row[strict].nth(4).get_attribute("class") or "")
                assert await page.locator(f'#schemas tr[data-topic="{busy_topic}"]').count() == 0   # no schema, no count

                ARTIFACTS.mkdir(exist_ok=True)
                await page.screenshot(path=str(ARTIFACTS / "audit-dashboard.png"), full_page=True)
                assert errors == []
            finally:
                await browser.close()
    finally:
        await service.stop()
