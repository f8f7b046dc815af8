"""The audit dashboard: an aiohttp app served by the auditor, and `AuditService` to run both.

Routes: `/` (the page, `static/index.html` + `static/dashboard.js`, charts by the vendored
uPlot), `/api/summary` (one row per topic and group, worst first), `/api/series` (per-window
figures of one topic, the charts' data), `/api/cost` (each topic's monthly cost, as `memq cost`
shows it, read from the brokers), `/api/schemas` (each topic's schemas in the registry and the
records its checks refused, dead-lettered or warned of: `schema_panel`), `/api/tables` (each
table sync's rows, schema version, last commit, dead letters and lag: `table_board`), `/metrics` (Prometheus, the same figures),
`/healthz`. Everything is computed from the books on request, under the auditor's lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from memq.audit.auditor import Auditor
from memq.audit.books import BOOKS_MS, LIVE_MS, Books, GroupSummary
from memq.audit.schema_panel import schema_panel
from memq.audit.table_board import TableBoard
from memq.config import MemqConfig
from memq.cost import report, usage
from memq.client._auth import BrokerAuth
from memq.cost.scrape import cluster_brokers, scrape
from memq.errors import InvalidInputError, MemqError

STATIC = Path(__file__).parent / "static"
_SIZES = {"10": LIVE_MS, "60": BOOKS_MS}
AUDITOR_KEY = web.AppKey("auditor", Auditor)
TABLES_KEY = web.AppKey("tables", TableBoard)
_COST_TIMEOUT_S = 3.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def summary_json(rows: list[GroupSummary]) -> list[dict[str, Any]]:
    return [{**dataclasses.asdict(r), "status": r.status.name} for r in rows]


def series_json(books: Books, topic: str, size_ms: int, since_ms: int) -> dict[str, Any]:
    """Aligned per-window arrays for the charts: rates in LogMessages/s, the rest per window
    (lag as last measured in it: the newest window shows the summary's lag)."""
    groups = books.groups(topic)
    produced = dict(books.series(size_ms, topic, "", since_ms))
    per_group = {g: dict(books.series(size_ms, topic, g, since_ms)) for g in groups}
    starts = sorted(set(produced).union(*per_group.values()))
    size_s = size_ms / 1000
    out: dict[str, Any] = {
        "topic": topic, "size_s": size_s, "t": [s / 1000 for s in starts],
        "produced_rate": [produced[s].produced / size_s if s in produced else 0 for s in starts],
        "groups": {},
    }
    for g, ws in per_group.items():
        rows = [ws.get(s) for s in starts]
        out["groups"][g] = {
            "consumed_rate": [w.consumed / size_s if w else 0 for w in rows],
            "lost": [w.lost if w else 0 for w in rows],
            "duplicates": [w.duplicates if w else 0 for w in rows],
            "mismatches": [w.mismatches if w else 0 for w in rows],
            "p50_ms": [w.percentile_ms(0.5) if w else None for w in rows],
            "p99_ms": [w.percentile_ms(0.99) if w else None for w in rows],
            "max_ms": [w.latency_max_ms if w and w.latency else None for w in rows],
            "lag_messages": [w.lag_messages if w else None for w in rows],
            "lag_s": [w.lag_ms / 1000 if w else None for w in rows],
        }
    return out


class BooksCollector(Collector):
    """Prometheus view of the books (same figures as the page), read at scrape time."""

    def __init__(self, auditor: Auditor) -> None:
        self._auditor = auditor

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        rows = self._auditor.read(lambda b: b.summary(_now_ms()))
        tg = ["topic", "group"]
        produced = CounterMetricFamily("memq_audit_produced", "LogMessages acked to producers", labels=["topic"])
        aborted = CounterMetricFamily("memq_audit_aborted", "LogMessages of aborted transactions (never readable)",
                                      labels=["topic"])
        consumed = CounterMetricFamily("memq_audit_consumed", "Distinct LogMessages consumed", labels=tg)
        dups = CounterMetricFamily("memq_audit_duplicates", "LogMessages delivered again", labels=tg)
        bad = CounterMetricFamily("memq_audit_mismatches", "LogMessages whose digest differs (corrupt)", labels=tg)
        lost = GaugeMetricFamily("memq_audit_lost_messages",
                                 "LogMessages the group moved past without consuming", labels=tg)
        expired = GaugeMetricFamily("memq_audit_expired_messages",
                                    "LogMessages retention deleted before the group consumed them", labels=tg)
        lat = GaugeMetricFamily("memq_audit_latency_seconds", "End-to-end latency, last minute",
                                labels=[*tg, "quantile"])
        lag_m = GaugeMetricFamily("memq_audit_lag_messages", "Backlog: LogMessages acked, not consumed yet", labels=tg)
        lag_s = GaugeMetricFamily("memq_audit_lag_seconds", "Age of the oldest unconsumed Message", labels=tg)
        status = GaugeMetricFamily("memq_audit_status",
                                  "0 OK, 1 IDLE, 2 LAG, 3 STALLED, 4 STOPPED, 5 LOSS", labels=tg)
        seen_topics = set()
        for r in rows:
            if r.topic not in seen_topics:
                seen_topics.add(r.topic)
                produced.add_metric([r.topic], r.produced)
                aborted.add_metric([r.topic], r.aborted)
            labels = [r.topic, r.group]
            consumed.add_metric(labels, r.consumed)
            dups.add_metric(labels, r.duplicates)
            bad.add_metric(labels, r.mismatches)
            lost.add_metric(labels, r.lost)
            expired.add_metric(labels, r.expired)
            for q, v in (("0.5", r.p50_ms), ("0.99", r.p99_ms), ("1", r.max_ms if r.p50_ms is not None else None)):
                if v is not None:
                    lat.add_metric([*labels, q], v / 1000)
            lag_m.add_metric(labels, r.lag_messages)
            lag_s.add_metric(labels, r.lag_s)
            status.add_metric(labels, int(r.status))
        stats = self._auditor.stats()
        records = CounterMetricFamily("memq_auditor_records", "Audit records accounted for since start")
        records.add_metric([], stats.records)
        bad_payloads = CounterMetricFamily("memq_auditor_bad_payloads", "Undecodable audit-topic messages")
        bad_payloads.add_metric([], stats.bad_payloads)
        yield from (produced, aborted, consumed, dups, bad, lost, expired, lat, lag_m, lag_s, status, records, bad_payloads)


async def _index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


async def _summary(request: web.Request) -> web.Response:
    auditor = request.app[AUDITOR_KEY]
    now = _now_ms()
    rows = auditor.read(lambda b: b.summary(now))
    return web.json_response({"cluster": auditor.config.cluster.name, "now_ms": now,
                              "rows": summary_json(rows)})


async def _series(request: web.Request) -> web.Response:
    topic = request.query.get("topic", "")
    size = request.query.get("size", "10")
    try:
        minutes = float(request.query.get("minutes", "15"))
    except ValueError:
        minutes = -1
    if not topic or size not in _SIZES or not 0 < minutes <= 24 * 60:
        raise web.HTTPBadRequest(text="need topic=NAME, size=10|60 and 0 < minutes <= 1440")
    since = _now_ms() - int(minutes * 60_000)
    body = request.app[AUDITOR_KEY].read(lambda b: series_json(b, topic, _SIZES[size], since))
    return web.json_response(body)


async def _cost(request: web.Request) -> web.Response:
    """Each topic's monthly estimate since its brokers started (`memq cost --json`), from producer.brokers."""
    config = request.app[AUDITOR_KEY].config
    try:
        days = float(request.query.get("retention_days", "7"))
    except ValueError:
        days = -1
    if not 0 <= days <= 3650:
        raise web.HTTPBadRequest(text="need 0 <= retention_days <= 3650")

    def measure() -> dict[str, Any]:
        auth = BrokerAuth.of(config.producer)
        urls = cluster_brokers(config.producer.brokers, _COST_TIMEOUT_S, auth)
        return report(urls, usage(scrape(urls, _COST_TIMEOUT_S, auth)), days * 86_400, config.cost)

    try:
        return web.json_response(await asyncio.get_running_loop().run_in_executor(None, measure))
    except MemqError as e:   # no broker answered: the panel says so (a 200: browsers log any 5xx as an error)
        return web.json_response({"error": str(e)})


async def _schemas(request: web.Request) -> web.Response:
    """Each topic's schemas and its checks' refused / dead-lettered / warned counts (`schema_panel`)."""
    config = request.app[AUDITOR_KEY].config
    try:
        return web.json_response(await asyncio.get_running_loop().run_in_executor(
            None, schema_panel, config, _COST_TIMEOUT_S))
    except MemqError as e:   # no broker answered: the panel says so
        return web.json_response({"error": str(e)})


async def _tables(request: web.Request) -> web.Response:
    """Each table sync's latest report and its lag now (`table_board`)."""
    try:
        return web.json_response(await asyncio.get_running_loop().run_in_executor(
            None, request.app[TABLES_KEY].panel, _now_ms()))
    except MemqError as e:   # Kafka did not answer: the panel says so
        return web.json_response({"error": str(e)})


async def _health(request: web.Request) -> web.Response:
    auditor = request.app[AUDITOR_KEY]
    return web.Response(status=200 if auditor.running else 503,
                        text="ok" if auditor.running else "auditor not running")


def make_app(auditor: Auditor) -> web.Application:
    """The dashboard app for a (started or not) auditor."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BooksCollector(auditor))

    async def metrics(request: web.Request) -> web.Response:
        body = await asyncio.get_running_loop().run_in_executor(None, generate_latest, registry)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})

    app = web.Application()
    app[AUDITOR_KEY] = auditor
    app[TABLES_KEY] = TableBoard(auditor.config)

    async def close_tables(app: web.Application) -> None:
        await asyncio.get_running_loop().run_in_executor(None, app[TABLES_KEY].close)

    app.on_cleanup.append(close_tables)
    app.router.add_get("/", _index)
    app.router.add_get("/api/summary", _summary)
    app.router.add_get("/api/series", _series)
    app.router.add_get("/api/cost", _cost)
    app.router.add_get("/api/schemas", _schemas)
    app.router.add_get("/api/tables", _tables)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", _health)
    app.router.add_static("/static/", STATIC)
    return app


class AuditService:
    """Auditor + dashboard in the caller's event loop: `url = await start()`, `await stop()`."""

    def __init__(self, config: MemqConfig, *, db_path: str | None = None,
                 host: str | None = None, port: int | None = None) -> None:
        self.auditor = Auditor(config, db_path=db_path)
        self._host = host if host is not None else config.audit.http_host
        self._port = port if port is not None else config.audit.http_port
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        """Start consuming and serving; returns the dashboard URL."""
        if not 0 <= self._port < 65536:
            raise InvalidInputError(f"audit.http_port {self._port} is not a TCP port")
        await asyncio.get_running_loop().run_in_executor(None, self.auditor.start)
        runner = web.AppRunner(make_app(self.auditor), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port)
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            await asyncio.get_running_loop().run_in_executor(None, self.auditor.stop)
            raise InvalidInputError(f"audit dashboard cannot listen on {self._host}:{self._port}: {e}") from None
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self.url = f"http://{host}:{port}/"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await asyncio.get_running_loop().run_in_executor(None, self.auditor.stop)


class AuditThread:
    """`AuditService` on its own thread and event loop, for synchronous hosts like `memq dev`.

    `with AuditThread(config, db_path=...) as audit: print(audit.url)`; start errors are
    raised in the caller.
    """

    def __init__(self, config: MemqConfig, *, db_path: str | None = None,
                 host: str | None = None, port: int | None = None) -> None:
        self.service = AuditService(config, db_path=db_path, host=host, port=port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="memq-audit-service",
                                        daemon=True)
        self.url = ""

    def __enter__(self) -> AuditThread:
        self._thread.start()
        try:
            self.url = asyncio.run_coroutine_threadsafe(self.service.start(), self._loop).result(60)
        except BaseException:
            self._shutdown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.service.stop(), self._loop).result(30)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
