"""Emitter -> real Kafka (tansu) -> auditor -> SQLite -> dashboard API, on the dev cluster.

The emitter is driven directly here (exact control over what each tier reports); the
end-to-end proof through the real producer, broker, S3 and consumer is test_audit_e2e.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from memq.audit.books import LIVE_MS, Books, BooksSettings, Status
from memq.audit.dashboard import AuditService
from memq.audit.emitter import AuditEmitter, make_audit_sink
from memq.audit.records import AuditRecord, Kind
from memq.audit.store import AuditStore
from memq.config import MemqConfig
from tests.support.audit import GRACE_S, audit_config, emit_traffic
from tests.support.waiting import async_wait_for

pytestmark = pytest.mark.integration


def summary(service: AuditService) -> dict[tuple[str, str], object]:
    rows = service.auditor.read(lambda b: b.summary(int(time.time() * 1000)))
    return {(r.topic, r.group): r for r in rows}


async def test_books_balance_and_survive_a_restart(memq_config: MemqConfig, unique_name: Callable[[str], str],
                                                   tmp_path: Path) -> None:
    cfg = audit_config(memq_config, unique_name)
    em = make_audit_sink(cfg, client_id="test")
    assert em is not None
    ok, bad = unique_name("ok"), unique_name("bad")
    emit_traffic(em, ok, "g1", messages=50, count=20)
    now = emit_traffic(em, bad, "g1", messages=40, count=25, lose=range(10, 13), duplicate=range(20, 22),
                       corrupt=range(30, 31))
    expected_records = 50 * 2 + 40 + 37 + 2
    db = tmp_path / "audit.db"
    service = AuditService(cfg, db_path=str(db), port=0)
    url = await service.start()
    try:
        await async_wait_for(lambda: service.auditor.stats().records == expected_records, 20, "all records")
        await asyncio.sleep(GRACE_S + 1.0)           # losses are decided after the grace period
        rows = summary(service)
        good, poor = rows[(ok, "g1")], rows[(bad, "g1")]
        assert (good.produced, good.consumed, good.lost, good.duplicates, good.mismatches) == (1000, 1000, 0, 0, 0)
        assert good.status is Status.OK and good.lag_messages == 0
        assert (poor.produced, poor.consumed, poor.lost, poor.duplicates, poor.mismatches) == (1000, 925, 75, 50, 25)
        assert poor.status is Status.LOSS
        assert poor.p50_ms == pytest.approx(80, rel=0.05) and poor.max_ms == 80
        assert list(rows)[0] == (bad, "g1")                         # worst first
        created_window = (now - 500) - (now - 500) % LIVE_MS
        lost_by_window = service.auditor.read(
            lambda b: {s: w.lost for s, w in b.series(LIVE_MS, bad, "g1", 0) if w.lost})
        assert sum(lost_by_window.values()) == 75 and set(lost_by_window) <= {created_window, created_window + LIVE_MS}

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            async with http.get(url + "api/summary") as r:
                api = {(x["topic"], x["group"]): x for x in (await r.json())["rows"]}
            assert api[(bad, "g1")]["lost"] == 75 and api[(bad, "g1")]["status"] == "LOSS"
            async with http.get(url + f"api/series?topic={bad}&size=10") as r:
                series = await r.json()
            assert sum(series["groups"]["g1"]["lost"]) == 75
            assert sum(series["produced_rate"]) * 10 == 1000
            async with http.get(url + "metrics") as r:
                metrics = await r.text()
            assert f'memq_audit_lost_messages{{group="g1",topic="{bad}"}} 75.0' in metrics
            assert f'memq_audit_produced_total{{topic="{ok}"}} 1000.0' in metrics
            async with http.get(url + "api/series?topic=x&size=7") as r:
                assert r.status == 400
    finally:
        await service.stop()

    emit_traffic(em, ok, "g1", messages=10, count=20, first_seq=50)      # while the auditor is down
    em.close()
    service = AuditService(cfg, db_path=str(db), port=0)
    await service.start()
    try:
        rows = summary(service)                                          # restored from SQLite
        assert (rows[(bad, "g1")].lost, rows[(bad, "g1")].duplicates) == (75, 50)
        await async_wait_for(lambda: summary(service)[(ok, "g1")].consumed == 1200, 20, "new records")
        await asyncio.sleep(0.6)                                         # nothing counted twice
        rows = summary(service)
        assert (rows[(ok, "g1")].produced, rows[(ok, "g1")].consumed, rows[(ok, "g1")].lost) == (1200, 1200, 0)
        assert service.auditor.stats().records == 20
    finally:
        await service.stop()


def test_switched_off_means_no_emitter(memq_config: MemqConfig) -> None:
    off = dataclasses.replace(memq_config, audit=dataclasses.replace(memq_config.audit, enabled=False))
    assert make_audit_sink(off) is None


def test_emitter_never_blocks_and_counts_drops(memq_config: MemqConfig, unique_name: Callable[[str], str]) -> None:
    cfg = audit_config(memq_config, unique_name, buffer_records=1000, flush_ms=60_000)
    em = AuditEmitter(cfg.kafka, cfg.audit, cfg.cluster.name)
    try:
        n = 50_000
        t0 = time.perf_counter()
        for s in range(n):
            em.produced(topic="t", producer_id=1, epoch=0, sequence=s, count=1, digest=s, created_ms=1)
        per_call_us = (time.perf_counter() - t0) / n * 1e6
        st = em.stats()
        assert st.buffered == 1000 and st.dropped == n - 1000
        assert per_call_us < 20, f"{per_call_us:.2f} us per audit call"
        assert em.flush(10) == 0 and em.stats().sent == 1000
    finally:
        em.close()


async def api_rows(url: str) -> dict[tuple[str, str], dict]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        async with http.get(url + "api/summary") as r:
            return {(x["topic"], x["group"]): x for x in (await r.json())["rows"]}


async def test_books_of_another_kafka_are_dropped_not_counted(
        memq_config: MemqConfig, unique_name: Callable[[str], str], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """A database left by an earlier Kafka (new cluster id, or offsets past the end) starts over."""
    cfg = audit_config(memq_config, unique_name)
    db = tmp_path / "audit.db"
    ghost, fresh = unique_name("ghost"), unique_name("fresh")

    def leave_old_books(kafka_cluster: str | None) -> None:
        """Books of a topic with unconsumed, passed Messages, read up to offset 10**6."""
        old = Books(BooksSettings(grace_ms=1))
        t = int(time.time() * 1000) - 30_000
        for s in range(3):
            old.add(AuditRecord(Kind.PRODUCED, ghost, "", 1, 0, s, 10, 1, t + s, t + s))
        old.add(AuditRecord(Kind.CONSUMED, ghost, "g1", 1, 0, 2, 10, 1, t + 2, t + 5))
        store = AuditStore(db)
        if kafka_cluster is not None:
            store.reset(kafka_cluster)
        store.commit(old.drain_changes(), {0: 10**6})
        store.close()

    em = make_audit_sink(cfg, client_id="test")
    assert em is not None
    emit_traffic(em, fresh, "g1", messages=5, count=2)
    for stored_cluster, reason in (("another-kafka", "this is"), (None, "beyond the end of partition 0")):
        if stored_cluster is None:               # the same cluster id, but a Kafka restarted empty
            stored_cluster = AuditStore(db).kafka_cluster()
        leave_old_books(stored_cluster)
        caplog.clear()
        service = AuditService(cfg, db_path=str(db), port=0)
        url = await service.start()
        try:
            assert any(reason in r.getMessage() and "read from the beginning" in r.getMessage()
                       for r in caplog.records)
            await async_wait_for(lambda: service.auditor.stats().records == 10, 20, "the new records")
            await asyncio.sleep(GRACE_S + 1.0)
            rows = await api_rows(url)
            assert not [k for k in rows if k[0] == ghost]         # nothing of the old Kafka
            assert (rows[(fresh, "g1")]["produced"], rows[(fresh, "g1")]["lost"]) == (10, 0)
        finally:
            await service.stop()
    em.close()


async def test_a_stopped_group_shows_its_backlog_not_loss(
        memq_config: MemqConfig, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    cfg = audit_config(memq_config, unique_name, stall_s=1.0)
    em = make_audit_sink(cfg, client_id="test")
    assert em is not None
    topic = unique_name("stopped")
    emit_traffic(em, topic, "g1", messages=20, count=3, lose=range(12, 20))   # its consumer exited at 12
    service = AuditService(cfg, db_path=str(tmp_path / "audit.db"), port=0)
    url = await service.start()
    try:
        await async_wait_for(lambda: service.auditor.stats().records == 32, 20, "all records")
        await asyncio.sleep(GRACE_S + 1.5)
        row = (await api_rows(url))[(topic, "g1")]
        assert (row["status"], row["lost"], row["lag_messages"], row["consumed"]) == ("STOPPED", 0, 24, 36)
    finally:
        await service.stop()
        em.close()
